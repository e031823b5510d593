"""The console's schedule list is ordered tenant first, then by name, so a busy tenant's schedules do not bury the
others': this index serves that order (0.5 ms for a page over 1 M schedules, against 300-460 ms sorting them).

Built CONCURRENTLY, outside a transaction (schedules is a shared app: this runs once, in the public schema): the
build holds no reader or writer of the schedule table; it waits for the transactions older than it (a long report)
and stalls nothing meanwhile. A build that failed leaves an INVALID index; running the migration again drops it and
builds it anew, as `IF NOT EXISTS` alone would keep the broken one.
"""

from django.db import migrations, models

INDEX = "schedule_tenant_name"
DEFINITION = "ON schedules_schedule (tenant_id, name, id)"


def build(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s", [INDEX]
        )
        found = cursor.fetchone()
        if found is not None and found[0]:
            return
        if found is not None:
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
        cursor.execute(f"CREATE INDEX CONCURRENTLY {INDEX} {DEFINITION}")


def drop(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("schedules", "0018_schedule_retry_policy")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(build, drop)],
            state_operations=[
                migrations.AddIndex(
                    model_name="schedule",
                    index=models.Index(fields=["tenant", "name", "id"], name=INDEX),
                )
            ],
        ),
    ]
