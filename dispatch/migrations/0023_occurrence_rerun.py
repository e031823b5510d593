"""Re-runs of missed and overlap-skipped occurrences (dispatch/rerun.py): an operator's "run this very fire", with who,
when, why and the judgement it set aside.

A new small table, as 0022 made for resolutions: adding columns to the partitioned occurrence table would take an
ACCESS EXCLUSIVE lock on it and every day partition; creating a table locks nothing that exists. Its lock wait is
still bounded at 5 s, as every dispatch migration's is, so it fails (to be run again) rather than wait behind anything.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0022_occurrence_resolution")]

    operations = [
        migrations.RunSQL("SET LOCAL lock_timeout = '5s'", migrations.RunSQL.noop),
        migrations.CreateModel(
            name="OccurrenceRerun",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("occurrence_id", models.UUIDField()),
                ("scheduled_for", models.DateTimeField()),
                ("tenant_id", models.BigIntegerField()),
                ("previous_state", models.CharField(max_length=16)),
                ("previous_reason", models.TextField(blank=True, default="")),
                ("rerun_at", models.DateTimeField()),
                ("rerun_by", models.CharField(max_length=200)),
                ("note", models.TextField()),
            ],
            options={
                "db_table": "dispatch_occurrence_rerun",
                "ordering": ["rerun_at"],
                "indexes": [
                    models.Index(fields=["occurrence_id", "scheduled_for"], name="rerun_by_occurrence"),
                    models.Index(fields=["scheduled_for"], name="rerun_by_day"),
                ],
            },
        ),
    ]
