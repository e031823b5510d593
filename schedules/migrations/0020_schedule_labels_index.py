"""The label selectors' index (core/labels.py): `key=value` requirements are jsonb containment (labels @> {...}),
which a GIN index with jsonb_path_ops serves beside the tenant's own index.

Built CONCURRENTLY, outside a transaction (schedules is a shared app: this runs once, in the public schema): the
build holds no reader or writer of the schedule table; it waits for the transactions older than it (a long report)
and stalls nothing meanwhile. A build that failed leaves an INVALID index; running the migration again drops it and
builds it anew, as `IF NOT EXISTS` alone would keep the broken one.
"""

from django.contrib.postgres.indexes import GinIndex
from django.db import migrations

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
        if found is not None:
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
        cursor.execute(f"CREATE INDEX CONCURRENTLY {INDEX} {DEFINITION}")


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
