"""Room on every heap page of the hot tables for the updates that follow an insert within seconds.

An envelope is leased, stamped and deleted; an occurrence is claimed, completed and settled; a schedule's cursor moves
at every fire. With full pages each of those updates moved the row to another page, logged the whole row (the
envelope's body included) and wrote a new entry in every index: about 6 KB of WAL per fire at the steady rate
(docs/BENCHMARKS.md, "Steady load"). Setting a fill factor changes only the catalog (SHARE UPDATE EXCLUSIVE, no
conflict with reads or writes) and applies to pages filled from now on; the day partitions made from now on get theirs
at creation (dispatch/partitions.py FILLFACTOR). The lock waits at most 5 s, like every upkeep statement.
"""

from django.db import migrations

from dispatch.partitions import FILLFACTOR
from dispatch.sql import maintenance as maintenance_sql

OUTBOX_FILLFACTOR = 50
CURSOR_FILLFACTOR = 80


def set_fillfactors(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '5s'")
        cursor.execute(f"ALTER TABLE dispatch_outboxmessage SET (fillfactor = {OUTBOX_FILLFACTOR})")
        cursor.execute(f"ALTER TABLE schedules_schedulecursor SET (fillfactor = {CURSOR_FILLFACTOR})")
        for parent, fillfactor in FILLFACTOR.items():
            cursor.execute(maintenance_sql.PARTITION_CHILDREN, [parent])  # the day partitions and DEFAULT
            for (partition,) in sorted(cursor.fetchall()):
                cursor.execute(f'ALTER TABLE "public"."{partition}" SET (fillfactor = {fillfactor})')


def reset_fillfactors(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '5s'")
        cursor.execute("ALTER TABLE dispatch_outboxmessage RESET (fillfactor)")
        cursor.execute("ALTER TABLE schedules_schedulecursor RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0014_outbox_created_at_default"), ("schedules", "0009_validate_kind_has_time")]

    operations = [migrations.RunPython(set_fillfactors, reset_fillfactors)]
