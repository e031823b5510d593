"""Resolutions of dead occurrences (dispatch/dlq.py): an operator's "nothing more to do", with who, when and why.

A new table of its own, not columns of dispatch_occurrence: adding columns to the partitioned occurrence table takes
an ACCESS EXCLUSIVE lock on it and on every day partition, which would queue every write of the data plane behind
any long statement on one of them; creating a table locks nothing that exists. Its lock wait is still bounded at
5 s, as every dispatch migration's is, so it fails (to be run again) rather than wait behind anything.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0021_notification_selector")]

    operations = [
        migrations.RunSQL("SET LOCAL lock_timeout = '5s'", migrations.RunSQL.noop),
        migrations.CreateModel(
            name="OccurrenceResolution",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("occurrence_id", models.UUIDField()),
                ("scheduled_for", models.DateTimeField()),
                ("attempt_count", models.PositiveSmallIntegerField()),
                ("tenant_id", models.BigIntegerField()),
                ("resolved_at", models.DateTimeField()),
                ("resolved_by", models.CharField(max_length=200)),
                ("note", models.TextField()),
            ],
            options={
                "db_table": "dispatch_occurrence_resolution",
                "ordering": ["resolved_at"],
                "indexes": [models.Index(fields=["scheduled_for"], name="resolution_by_day")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("occurrence_id", "scheduled_for", "attempt_count"), name="resolution_once_per_death"
                    )
                ],
            },
        ),
    ]
