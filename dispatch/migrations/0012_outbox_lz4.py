"""The outbox's large columns compressed with lz4 instead of pglz.

An envelope's body (~10 KB for 250 fires) and id array (4 KB) are past PostgreSQL's 2 KB threshold, so each is
compressed as the materializer writes it: pglz_compress was 2.5 % of the PostgreSQL backends' CPU during a
500,000-fire burst (perf), mostly failing on random ids. lz4 compresses several times faster and gives up sooner on
data it cannot shrink. Existing rows keep their pglz values (both stay readable); the outbox is short-lived anyway.
A server built without lz4 keeps pglz: the migration checks what the server offers instead of failing.
"""

from django.db import migrations

COLUMNS = ("body", "occurrence_ids", "scheduled_fors")


def set_compression(method: str):
    def apply(apps, schema_editor):
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT %s = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'", [method])
            row = cursor.fetchone()
            if not row or not row[0]:
                return
            for column in COLUMNS:
                cursor.execute(f"ALTER TABLE dispatch_outboxmessage ALTER COLUMN {column} SET COMPRESSION {method}")

    return apply


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0011_drop_occurrence_unique_fire")]

    operations = [migrations.RunPython(set_compression("lz4"), set_compression("pglz"))]
