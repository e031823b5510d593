"""The occurrences the engine looks for by state (running, retry_wait, dead) are found in a small table of their own,
dispatch_occurrence_watch, kept by triggers, instead of through three partial indexes on the occurrence table.

A partial index's predicate makes its column an indexed column: with `WHERE state = 'running'` on any index, every
change of state was a non-HOT update, which wrote a new entry into each of the occurrence table's indexes (primary
key, unique fire, a schedule's recent fires, the BRIN) and left a dead row version that only VACUUM could clear.
A fire changes state twice (claimed, finished), so each fire cost eight index entries more than its insert, and the
day partitions' VACUUM (which reads every index of the partition) grew with the day. With state and lease in no
index of the occurrence table, both updates are HOT: the row version stays on its page, no index is written, and the
page's own pruning reclaims the old versions (docs/DESIGN.md, "State changes that stay on their page").

The triggers follow every statement that changes occurrences through the parent table, so no writer can forget the
watch: UPDATE and DELETE once per statement, with transition tables (one plan for the statement's rows); INSERT per
row, only for a row inserted already in a watched state (the trigger's WHEN is checked in the executor, so the
materializer's COPY of scheduled rows fires nothing, and keeps its multi-row inserts, which a statement trigger with
a transition table would turn off on a partitioned table). A partition dropped or written directly (upkeep's DROP of
a past day, the DEFAULT partition's DELETE) fires nothing: dispatch/partitions.py deletes the watch rows of the rows
it removes, in the same transaction.

One transaction: CREATE TRIGGER locks the occurrence table against writes until the commit, so the rows copied in
below are exactly the watched ones at the moment the triggers take over. Each lock waits at most 5 s, like every
upkeep statement; the migration fails (to be run again) rather than queue every write behind it.
"""

from django.db import migrations, models

WATCHED = "('running', 'retry_wait', 'dead')"

FORWARD = f"""
SET LOCAL lock_timeout = '5s';
CREATE TABLE dispatch_occurrence_watch (
    occurrence_id uuid NOT NULL,
    scheduled_for timestamptz NOT NULL,
    schedule_id uuid NOT NULL,
    tenant_id bigint NOT NULL,
    state varchar(16) NOT NULL,
    attempt_count smallint NOT NULL,
    lease_expires_at timestamptz NULL,
    PRIMARY KEY (occurrence_id, scheduled_for)
);
-- The lease reaper's scan, and the running counts of /metrics and the console.
CREATE INDEX watch_running_lease ON dispatch_occurrence_watch (lease_expires_at) WHERE state = 'running';
-- Overlap policies ask "is a sibling running or waiting?" at every claim of such a schedule.
CREATE INDEX watch_by_schedule ON dispatch_occurrence_watch (schedule_id);
-- The DLQ of one tenant (replay --dead --tenant, the console).
CREATE INDEX watch_dead_by_tenant ON dispatch_occurrence_watch (tenant_id) WHERE state = 'dead';

CREATE FUNCTION dispatch_occurrence_watch_follow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO dispatch_occurrence_watch
        VALUES (NEW.occurrence_id, NEW.scheduled_for, NEW.schedule_id, NEW.tenant_id, NEW.state, NEW.attempt_count,
                NEW.lease_expires_at)
        ON CONFLICT (occurrence_id, scheduled_for) DO NOTHING;
    ELSIF TG_OP = 'DELETE' THEN
        DELETE FROM dispatch_occurrence_watch AS w USING before_rows AS b
        WHERE b.state IN {WATCHED} AND w.occurrence_id = b.occurrence_id AND w.scheduled_for = b.scheduled_for;
    ELSE
        -- Rows that left the watched states: found by joining the statement's old and new rows (a hash join of two
        -- in-memory sets), so a statement that moves no watched row, such as the relay's settle, probes nothing.
        DELETE FROM dispatch_occurrence_watch AS w
        USING before_rows AS b
        JOIN after_rows AS a ON a.occurrence_id = b.occurrence_id AND a.scheduled_for = b.scheduled_for
        WHERE b.state IN {WATCHED} AND a.state NOT IN {WATCHED}
          AND w.occurrence_id = b.occurrence_id AND w.scheduled_for = b.scheduled_for;
        INSERT INTO dispatch_occurrence_watch AS w
        SELECT a.occurrence_id, a.scheduled_for, a.schedule_id, a.tenant_id, a.state, a.attempt_count,
               a.lease_expires_at
        FROM after_rows AS a
        WHERE a.state IN {WATCHED}
        ON CONFLICT (occurrence_id, scheduled_for) DO UPDATE
        SET state = EXCLUDED.state, attempt_count = EXCLUDED.attempt_count,
            lease_expires_at = EXCLUDED.lease_expires_at
        WHERE (w.state, w.attempt_count, w.lease_expires_at)
              IS DISTINCT FROM (EXCLUDED.state, EXCLUDED.attempt_count, EXCLUDED.lease_expires_at);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER occurrence_watch_update AFTER UPDATE ON dispatch_occurrence
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dispatch_occurrence_watch_follow();
CREATE TRIGGER occurrence_watch_delete AFTER DELETE ON dispatch_occurrence
    REFERENCING OLD TABLE AS before_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dispatch_occurrence_watch_follow();
CREATE TRIGGER occurrence_watch_insert AFTER INSERT ON dispatch_occurrence
    FOR EACH ROW WHEN (NEW.state IN {WATCHED}) EXECUTE FUNCTION dispatch_occurrence_watch_follow();

INSERT INTO dispatch_occurrence_watch
SELECT occurrence_id, scheduled_for, schedule_id, tenant_id, state, attempt_count, lease_expires_at
FROM dispatch_occurrence WHERE state IN {WATCHED};

DROP INDEX occurrence_dead;
DROP INDEX occurrence_running_lease;
DROP INDEX occurrence_active_by_schedule;
"""

BACKWARD = """
SET LOCAL lock_timeout = '5s';
CREATE INDEX occurrence_dead ON dispatch_occurrence (tenant_id) WHERE state = 'dead';
CREATE INDEX occurrence_running_lease ON dispatch_occurrence (lease_expires_at) WHERE state = 'running';
CREATE INDEX occurrence_active_by_schedule ON dispatch_occurrence (schedule_id)
    WHERE state IN ('running', 'retry_wait');
DROP TRIGGER occurrence_watch_insert ON dispatch_occurrence;
DROP TRIGGER occurrence_watch_delete ON dispatch_occurrence;
DROP TRIGGER occurrence_watch_update ON dispatch_occurrence;
DROP FUNCTION dispatch_occurrence_watch_follow();
DROP TABLE dispatch_occurrence_watch;
"""


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0016_outbox_published_by_class")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.CreateModel(
                    name="OccurrenceWatch",
                    fields=[
                        ("occurrence_id", models.UUIDField(editable=False, primary_key=True, serialize=False)),
                        ("scheduled_for", models.DateTimeField()),
                        ("schedule_id", models.UUIDField()),
                        ("tenant_id", models.BigIntegerField()),
                        ("state", models.CharField(max_length=16)),
                        ("attempt_count", models.SmallIntegerField()),
                        ("lease_expires_at", models.DateTimeField(blank=True, null=True)),
                    ],
                    options={"db_table": "dispatch_occurrence_watch"},
                ),
            ],
        ),
    ]
