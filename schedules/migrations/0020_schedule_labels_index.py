"""The label selectors' index (core/labels.py): `key=value` requirements are jsonb containment (labels @> {...}),
which a GIN index with jsonb_path_ops serves beside the tenant's own index.

Built CONCURRENTLY, outside a transaction (schedules is a shared app: this runs once, in the public schema): the
build holds no reader or writer of the schedule table. It waits for the transactions older than it, at most 5 s for
each (an idle transaction left open would otherwise stall it without end): past that the migration fails, leaving an
INVALID index, and running it again drops that index and builds it anew (`IF NOT EXISTS` alone would keep it).
"""

from django.contrib.postgres.indexes import GinIndex
from django.db import migrations

LOCK_TIMEOUT = "SET lock_timeout = '5s'"
INDEX = "schedule_labels"
DEFINITION = "ON schedules_schedule USING gin (labels jsonb_path_ops)"


def build(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s", [INDEX]
        )
        found = cursor.fetchone()
        if found is not None and found[0]:
            return
        # A concurrent build waits for every transaction older than it, an idle one too: at most 5 s for each, as
        # every upkeep lock here waits, so an open transaction fails the migration (run it again) instead of
        # stalling it without end. Session-level (no transaction here), so it is reset after.
        cursor.execute(LOCK_TIMEOUT)
        try:
            if found is not None:
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
            cursor.execute(f"CREATE INDEX CONCURRENTLY {INDEX} {DEFINITION}")
        finally:
            cursor.execute("RESET lock_timeout")


def drop(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("schedules", "0019_schedule_tenant_name")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(build, drop)],
            state_operations=[
                migrations.AddIndex(
                    model_name="schedule",
                    index=GinIndex(fields=["labels"], name=INDEX, opclasses=["jsonb_path_ops"]),
                )
            ],
        ),
    ]
