"""The unique fire (schedule, version, scheduled_for) is held by the primary key alone.

Every non-manual occurrence's id is uuid5 of exactly (schedule, version, scheduled_for) (dispatch/identity.py), and
scheduled_for is the key's second column, so a second row of the same fire collides on (occurrence_id,
scheduled_for) as surely as on the old index: every writer already relies on that key (ON CONFLICT DO NOTHING with
no target, COPY's unique violation). The index cost each fire a third b-tree entry, at a random place (schedule ids
are random): perf on the materializer's PostgreSQL backends during a 500,000-fire burst (docs/DESIGN.md, "Occurrence
ids and uniqueness"). Reconciliation reports any row whose id is not its fire's derived one (dispatch/reconcile.py).

Dropped from the partitioned parent, which drops it from every day partition at once. That takes an exclusive lock
on the parent and each partition, so the migration gives up after 5 s of waiting for one (a long transaction holding
a partition) instead of queueing every occurrence write behind it; run it again when that transaction has ended.
Rolling it back builds the index again with a plain CREATE, which holds a SHARE lock on every day partition for the
whole build: stop the materializers and relays first (and deal with any second row of a fire under a foreign id,
which `reconcile` lists as unexpected, or the build fails on it).
"""

from django.db import migrations

DROP = "SET LOCAL lock_timeout = '5s'; DROP INDEX IF EXISTS occurrence_unique_fire"
CREATE = """
CREATE UNIQUE INDEX IF NOT EXISTS occurrence_unique_fire ON dispatch_occurrence (schedule_id, schedule_version, scheduled_for)
    WHERE NOT manual
"""


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0010_running_last_taken")]

    operations = [migrations.RunSQL(DROP, CREATE)]
