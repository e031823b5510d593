"""Holiday calendars: a tenant's named dates and ranges (Calendar), the history of their contents (CalendarRevision),
and `exclude_calendars` on the schedule and its cursor (the materializer plans from the cursor).

On a table of 20 M schedules: both columns are nullable without a default (catalog writes). Each statement waits at
most 5 s for its lock instead of queueing every write behind a long transaction; run the migration again once that
transaction has ended.
"""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


class Migration(migrations.Migration):
    dependencies = [
        ("schedules", "0014_pause_until"),
        ("tenants", "0004_quota_help_texts"),
    ]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        migrations.AddField(
            model_name="schedule",
            name="exclude_calendars",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=63), blank=True, null=True, size=None
            ),
        ),
        migrations.AddField(
            model_name="schedulecursor",
            name="exclude_calendars",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=63), blank=True, null=True, size=None
            ),
        ),
        migrations.CreateModel(
            name="Calendar",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=63)),
                ("dates", models.JSONField(blank=True, default=list)),
                ("ranges", models.JSONField(blank=True, default=list)),
                ("description", models.CharField(blank=True, default="", max_length=500)),
                ("revision", models.PositiveIntegerField(default=1)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="calendars", to="tenants.tenant"
                    ),
                ),
            ],
            options={
                "ordering": ["tenant", "name"],
                "constraints": [models.UniqueConstraint(fields=("tenant", "name"), name="calendar_unique_name")],
            },
        ),
        migrations.CreateModel(
            name="CalendarRevision",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=63)),
                ("revision", models.PositiveIntegerField()),
                ("dates", models.JSONField()),
                ("ranges", models.JSONField()),
                ("valid_from", models.DateTimeField()),
                ("valid_to", models.DateTimeField(blank=True, null=True)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="tenants.tenant"
                    ),
                ),
            ],
            options={
                "ordering": ["tenant", "name", "valid_from"],
                "indexes": [models.Index(fields=["tenant", "name", "valid_from"], name="calendar_revision_by_name")],
            },
        ),
    ]
