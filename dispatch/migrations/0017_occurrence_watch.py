"""The occurrences the engine looks for by state (running, retry_wait, dead) are found in a small table of their own,
dispatch_occurrence_watch, kept by triggers, instead of through three partial indexes on the occurrence table.

A partial index's predicate makes its column an indexed column: with `WHERE state = 'running'` on any index, every
change of state was a non-HOT update, which wrote a new entry into each of the occurrence table's indexes (primary
key, a schedule's recent fires, the BRIN, and the partial ones the new state matched) and left a dead row version
that only VACUUM could clear. A fire changes state twice (claimed, finished), so each fire cost six or more index
entries beyond its insert, and the day partitions' VACUUM (which reads every index of the partition) grew with the
day. With state and lease in no
index of the occurrence table, both updates are HOT: the row version stays on its page, no index is written, and the
page's own pruning reclaims the old versions (docs/DESIGN.md, "State changes that stay on their page").

The triggers follow every statement that changes occurrences through the parent table, so no writer can forget the
watch: UPDATE and DELETE once per statement, with transition tables (one plan for the statement's rows); INSERT per
row, only for a row inserted already in a watched state (the trigger's WHEN is checked in the executor, so the
materializer's COPY of scheduled rows fires nothing, and keeps its multi-row inserts, which a statement trigger with
a transition table would turn off on a partitioned table). A partition dropped or written directly (upkeep's DROP of
a past day, the DEFAULT partition's DELETE) fires nothing: dispatch/partitions.py deletes the watch rows of the rows
it removes, in the same transaction. Names are schema-qualified: django-tenants puts a tenant's schema first on the
search path of the session a trigger may run in.

One transaction: CREATE TRIGGER locks the occurrence table against writes until the commit, so the rows copied in
below are exactly the watched ones at the moment the triggers take over; each state is copied through its old partial
index, so the lock is held for a read of those rows, not of every day. Each lock waits at most 5 s, like every
upkeep statement; the migration fails (to be run again) rather than queue every write behind it.
"""

from django.db import migrations, models

WATCHED = "('running', 'retry_wait', 'dead')"

FORWARD = f"""
SET LOCAL lock_timeout = '5s';
CREATE TABLE public.dispatch_occurrence_watch (
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
CREATE INDEX watch_running_lease ON public.dispatch_occurrence_watch (lease_expires_at) WHERE state = 'running';
-- Overlap policies ask "is a sibling running or waiting?" at every claim of such a schedule; dead rows (kept for the
-- retention) stay out of it.
CREATE INDEX watch_active_by_schedule ON public.dispatch_occurrence_watch (schedule_id)
    WHERE state IN ('running', 'retry_wait');
-- The DLQ: one tenant's dead fires newest first (the API's `?state=dead`, replay --dead --tenant), and a day's
-- (the drop of a day past the retention).
CREATE INDEX watch_dead_by_tenant ON public.dispatch_occurrence_watch (tenant_id, scheduled_for) WHERE state = 'dead';
CREATE INDEX watch_dead_by_day ON public.dispatch_occurrence_watch (scheduled_for) WHERE state = 'dead';

CREATE FUNCTION public.dispatch_occurrence_watch_follow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.dispatch_occurrence_watch (occurrence_id, scheduled_for, schedule_id, tenant_id, state,
                                                      attempt_count, lease_expires_at)
        VALUES (NEW.occurrence_id, NEW.scheduled_for, NEW.schedule_id, NEW.tenant_id, NEW.state, NEW.attempt_count,
                NEW.lease_expires_at)
        ON CONFLICT (occurrence_id, scheduled_for) DO UPDATE
        SET state = EXCLUDED.state, attempt_count = EXCLUDED.attempt_count,
            lease_expires_at = EXCLUDED.lease_expires_at;
    ELSIF TG_OP = 'DELETE' THEN
        DELETE FROM public.dispatch_occurrence_watch AS w USING before_rows AS b
        WHERE b.state IN {WATCHED} AND w.occurrence_id = b.occurrence_id AND w.scheduled_for = b.scheduled_for;
    ELSE
        -- Rows that were watched and are not under the same key any more (left the watched states). The old rows are
        -- filtered first, so a statement that moved no watched row (the relay's settle of scheduled rows) probes
        -- nothing; the new rows are joined as a hashed set.
        DELETE FROM public.dispatch_occurrence_watch AS w
        USING before_rows AS b
        WHERE b.state IN {WATCHED}
          AND w.occurrence_id = b.occurrence_id AND w.scheduled_for = b.scheduled_for
          AND NOT EXISTS (SELECT 1 FROM after_rows AS a
                          WHERE a.occurrence_id = b.occurrence_id AND a.scheduled_for = b.scheduled_for
                            AND a.state IN {WATCHED});
        -- Rows that are watched now and new to the watch or changed in what it holds: a statement that changed only
        -- other columns of running rows (the settle's enqueued_at, a forced flag) writes nothing here.
        INSERT INTO public.dispatch_occurrence_watch AS w (occurrence_id, scheduled_for, schedule_id, tenant_id,
                                                           state, attempt_count, lease_expires_at)
        SELECT a.occurrence_id, a.scheduled_for, a.schedule_id, a.tenant_id, a.state, a.attempt_count,
               a.lease_expires_at
        FROM after_rows AS a
        LEFT JOIN before_rows AS b ON b.occurrence_id = a.occurrence_id AND b.scheduled_for = a.scheduled_for
        WHERE a.state IN {WATCHED}
          AND (b.occurrence_id IS NULL
               OR (b.state, b.attempt_count, b.lease_expires_at)
                  IS DISTINCT FROM (a.state, a.attempt_count, a.lease_expires_at))
        ON CONFLICT (occurrence_id, scheduled_for) DO UPDATE
        SET state = EXCLUDED.state, attempt_count = EXCLUDED.attempt_count,
            lease_expires_at = EXCLUDED.lease_expires_at;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER occurrence_watch_update AFTER UPDATE ON public.dispatch_occurrence
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION public.dispatch_occurrence_watch_follow();
CREATE TRIGGER occurrence_watch_delete AFTER DELETE ON public.dispatch_occurrence
    REFERENCING OLD TABLE AS before_rows
    FOR EACH STATEMENT EXECUTE FUNCTION public.dispatch_occurrence_watch_follow();
CREATE TRIGGER occurrence_watch_insert AFTER INSERT ON public.dispatch_occurrence
    FOR EACH ROW WHEN (NEW.state IN {WATCHED}) EXECUTE FUNCTION public.dispatch_occurrence_watch_follow();

-- The rows watched now, each state read through its own partial index (still there), not a scan of every day.
INSERT INTO public.dispatch_occurrence_watch
SELECT occurrence_id, scheduled_for, schedule_id, tenant_id, state, attempt_count, lease_expires_at
FROM public.dispatch_occurrence WHERE state = 'running';
INSERT INTO public.dispatch_occurrence_watch
SELECT occurrence_id, scheduled_for, schedule_id, tenant_id, state, attempt_count, lease_expires_at
FROM public.dispatch_occurrence WHERE state = 'retry_wait';
INSERT INTO public.dispatch_occurrence_watch
SELECT occurrence_id, scheduled_for, schedule_id, tenant_id, state, attempt_count, lease_expires_at
FROM public.dispatch_occurrence WHERE state = 'dead';

DROP INDEX public.occurrence_dead;
DROP INDEX public.occurrence_running_lease;
DROP INDEX public.occurrence_active_by_schedule;
"""

BACKWARD = """
SET LOCAL lock_timeout = '5s';
CREATE INDEX occurrence_dead ON dispatch_occurrence (tenant_id) WHERE state = 'dead';
CREATE INDEX occurrence_running_lease ON dispatch_occurrence (lease_expires_at) WHERE state = 'running';
CREATE INDEX occurrence_active_by_schedule ON dispatch_occurrence (schedule_id)
    WHERE state IN ('running', 'retry_wait');
DROP TRIGGER occurrence_watch_insert ON public.dispatch_occurrence;
DROP TRIGGER occurrence_watch_delete ON public.dispatch_occurrence;
DROP TRIGGER occurrence_watch_update ON public.dispatch_occurrence;
DROP FUNCTION public.dispatch_occurrence_watch_follow();
DROP TABLE public.dispatch_occurrence_watch;
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
