"""UNIQUE(occurrence, generation) on attempts (docs/ARCHITECTURE.md, data model): one attempt row per fencing
generation.

dispatch_attempt is partitioned by scheduled_for, so the key must contain it: (occurrence_id, scheduled_for,
generation). It supersedes the plain index attempt_occurrence (occurrence_id, generation), which is dropped: every
read of attempts names occurrence_id, the new key's first column, and one index per insert is cheaper than two.

Built without blocking the workers' inserts. A plain CREATE UNIQUE INDEX on the parent would hold a SHARE lock on
every day partition for the whole build (billions of rows at 200 M attempts a day), stopping every claim. So:
1. an invalid index on the parent alone (ON ONLY: metadata, instant);
2. per partition, CREATE UNIQUE INDEX CONCURRENTLY, then ATTACH it to the parent's index; once every partition has
   one attached, PostgreSQL marks the parent's index valid, and partitions created later get theirs automatically;
3. a partition created while this runs (the materializer's day upkeep) is picked up by repeating step 2.
A duplicate (which the claim's row lock rules out) stops the migration with the offending key; the half-built
partition index is dropped so that the migration can simply be run again once the rows are dealt with.
"""

from django.db import migrations, models

PARENT = "dispatch_attempt"
INDEX = "attempt_generation_unique"
COLUMNS = "(occurrence_id, scheduled_for, generation)"
# Partitions of the parent without an index attached to INDEX yet.
UNINDEXED_PARTITIONS = """
SELECT child.relname
FROM pg_inherits
JOIN pg_class AS parent ON parent.oid = pg_inherits.inhparent
JOIN pg_class AS child ON child.oid = pg_inherits.inhrelid
JOIN pg_namespace AS ns ON ns.oid = parent.relnamespace
WHERE parent.relname = %s AND ns.nspname = 'public'
  AND NOT EXISTS (
      SELECT 1 FROM pg_inherits AS attached
      JOIN pg_class AS parent_index ON parent_index.oid = attached.inhparent
      JOIN pg_index AS child_index ON child_index.indexrelid = attached.inhrelid
      WHERE parent_index.relname = %s AND child_index.indrelid = child.oid
  )
ORDER BY child.relname
"""
PARENT_INDEX_VALID = """
SELECT i.indisvalid FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
JOIN pg_namespace AS ns ON ns.oid = c.relnamespace
WHERE c.relname = %s AND ns.nspname = 'public'
"""
MAX_PASSES = 5


def build_unique_index(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f'CREATE UNIQUE INDEX IF NOT EXISTS {INDEX} ON ONLY "public"."{PARENT}" {COLUMNS}')
        for _ in range(MAX_PASSES):
            cursor.execute(UNINDEXED_PARTITIONS, [PARENT, INDEX])
            partitions = [row[0] for row in cursor.fetchall()]
            for partition in partitions:
                _index_partition(cursor, partition)
            cursor.execute(PARENT_INDEX_VALID, [INDEX])
            if cursor.fetchone()[0]:
                break
        else:
            raise RuntimeError(f"{INDEX} is still not valid after {MAX_PASSES} passes; run the migration again.")
        cursor.execute("DROP INDEX IF EXISTS attempt_occurrence")


def _index_partition(cursor, partition: str) -> None:
    # Partition names are ours (dispatch/partitions.py: dispatch_attempt_pYYYYMMDD, dispatch_attempt_default).
    name = f"{partition}_generation_key"[:63]
    # An invalid index left by an interrupted build would make IF NOT EXISTS skip it and the attach fail.
    cursor.execute(
        "SELECT i.indisvalid FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid WHERE c.relname = %s",
        [name],
    )
    row = cursor.fetchone()
    if row is not None and not row[0]:
        cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "public"."{name}"')
    try:
        cursor.execute(f'CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "{name}" ON "public"."{partition}" {COLUMNS}')
    except Exception as exc:
        cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "public"."{name}"')
        raise RuntimeError(
            f"{partition} holds two attempts with the same (occurrence_id, scheduled_for, generation): {exc}. "
            "Renumber or remove the duplicate rows, then run the migration again."
        ) from exc
    cursor.execute(f'ALTER INDEX "public"."{INDEX}" ATTACH PARTITION "public"."{name}"')


def drop_unique_index(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f'CREATE INDEX IF NOT EXISTS attempt_occurrence ON "public"."{PARENT}" (occurrence_id, generation)'
        )
        cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [("dispatch", "0004_occurrence_state_reason")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name="attempt",
                    constraint=models.UniqueConstraint(
                        fields=("occurrence", "scheduled_for", "generation"), name=INDEX
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(build_unique_index, drop_unique_index)],
        ),
    ]
