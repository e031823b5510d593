"""The console's schedule list is ordered tenant first, then by name, so a busy tenant's schedules do not bury the
others': this index serves that order (0.5 ms for a page over 1 M schedules, against 300-460 ms sorting them).

The build holds the schedule table's writers while it reads the table, and waits at most 5 s for its lock: on a
large installation build it beforehand, outside any transaction, with `CREATE INDEX CONCURRENTLY IF NOT EXISTS
schedule_tenant_name ON schedules_schedule (tenant_id, name, id)`; this migration then finds it and only records it.
"""

from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"
CREATE_INDEX = "CREATE INDEX IF NOT EXISTS schedule_tenant_name ON schedules_schedule (tenant_id, name, id)"


class Migration(migrations.Migration):
    dependencies = [("schedules", "0018_schedule_retry_policy")]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(CREATE_INDEX, "DROP INDEX IF EXISTS schedule_tenant_name")],
            state_operations=[
                migrations.AddIndex(
                    model_name="schedule",
                    index=models.Index(fields=["tenant", "name", "id"], name="schedule_tenant_name"),
                )
            ],
        ),
    ]
