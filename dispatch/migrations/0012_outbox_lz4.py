"""The outbox's large columns compressed with lz4 instead of pglz.

An envelope's body (~10 KB for 250 fires) and id array (4 KB) are past PostgreSQL's 2 KB threshold, so each is
compressed as the materializer writes it: pglz_compress was 2.5 % of the PostgreSQL backends' CPU during a
500,000-fire burst (perf), mostly failing on random ids. lz4 compresses several times faster and gives up sooner on
data it cannot shrink. Existing rows keep their pglz values (both stay readable); the outbox is short-lived anyway.
A server built without lz4 keeps pglz: the migration checks what the server offers instead of failing.
"""

from django.db import migrations

COLUMNS = ("body", "occurrence_ids", "scheduled_fors")


def use_lz4(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
        row = cursor.fetchone()
        if not row or not row[0]:
            return
        set_compression(cursor, "lz4")


def use_server_default(apps, schema_editor):
    """Back to what the columns had before: no method of their own, the server's default_toast_compression."""
    with schema_editor.connection.cursor() as cursor:
        set_compression(cursor, "DEFAULT")


def set_compression(cursor, method: str) -> None:
    # One statement, one short lock of the outbox; given up after 5 s rather than queueing the relay behind it.
    cursor.execute("SET LOCAL lock_timeout = '5s'")
    changes = ", ".join(f"ALTER COLUMN {column} SET COMPRESSION {method}" for column in COLUMNS)
    cursor.execute(f"ALTER TABLE dispatch_outboxmessage {changes}")


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0011_drop_occurrence_unique_fire")]

    operations = [migrations.RunPython(use_lz4, use_server_default)]
