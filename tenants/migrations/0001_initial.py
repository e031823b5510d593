import django.db.models.deletion
import django_tenants.postgresql_backend.base
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Tenant",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "schema_name",
                    models.CharField(
                        db_index=True,
                        max_length=63,
                        unique=True,
                        validators=[django_tenants.postgresql_backend.base._check_schema_name],
                    ),
                ),
                ("slug", models.SlugField(max_length=40, unique=True)),
                ("name", models.CharField(max_length=200)),
                ("max_schedules", models.PositiveIntegerField(default=100000, help_text="Active plus paused schedules this tenant may hold.")),
                ("max_fires_per_second", models.PositiveIntegerField(default=10000, help_text="Dispatch rate above which this tenant's fires are throttled.")),
                ("max_running", models.PositiveIntegerField(default=1000, help_text="Occurrences of this tenant that may run at once on the workers.")),
                ("max_catchup_per_minute", models.PositiveIntegerField(default=600, help_text="Catch-up fires per minute after an outage (misfire policy catch_up).")),
                ("fairness_weight", models.PositiveSmallIntegerField(default=1, help_text="Relative share of dispatch capacity when tenants compete at the same instant.")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={"ordering": ["slug"]},
        ),
        migrations.CreateModel(
            name="Domain",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("domain", models.CharField(db_index=True, max_length=253, unique=True)),
                ("is_primary", models.BooleanField(db_index=True, default=True)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="domains", to="tenants.tenant"
                    ),
                ),
            ],
            options={"ordering": ["domain"]},
        ),
    ]
