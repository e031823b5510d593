"""The watch trigger without a join of its transition tables: each branch probes the watch's key with arrays.

0018 found the rows that left the watched states by joining the statement's old and new rows, then the watch. Over
transition tables (no statistics) and a watch that is usually small, the plan is the planner's guess: in the steady
bench (auto_explain, 2,315 fires a second) it joined the new rows to the watch first, estimated one row, and scanned
the old rows once per row of that join: a worker's completion of 1,000 fires removed 999,000 rows by join filter
and spent 1.2 s in the trigger, holding its row locks meanwhile while the settler waited for them. Now:
- a statement none of whose old rows was watched (a settle's scheduled -> enqueued) touches the watch only for the
  rows it moves into a watched state;
- otherwise the ids of its new rows outside the watched states are gathered into an array (one pass over the new
  rows) and deleted from the watch through its primary key's first column (`occurrence_id = ANY`): index probes,
  never a join the planner can misjudge. The id alone: an occurrence id names one occurrence (it is derived from its
  schedule and instant), and a second `= ANY` on scheduled_for would make PostgreSQL 15's btree descend once for
  every pair of the two arrays' elements;
- a DELETE of occurrences removes their watch rows the same way.
Rows that are watched now are upserted as before (one ON CONFLICT probe each, written only where something changed).
"""

from django.db import migrations

WATCHED = "('running', 'retry_wait', 'dead')"

FOLLOW = f"""
CREATE OR REPLACE FUNCTION public.dispatch_occurrence_watch_follow() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    gone_ids uuid[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.dispatch_occurrence_watch (occurrence_id, scheduled_for, schedule_id, tenant_id, state,
                                                      attempt_count, lease_expires_at)
        VALUES (NEW.occurrence_id, NEW.scheduled_for, NEW.schedule_id, NEW.tenant_id, NEW.state, NEW.attempt_count,
                NEW.lease_expires_at)
        ON CONFLICT (occurrence_id, scheduled_for) DO UPDATE
        SET state = EXCLUDED.state, attempt_count = EXCLUDED.attempt_count,
            lease_expires_at = EXCLUDED.lease_expires_at;
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        SELECT array_agg(b.occurrence_id) INTO gone_ids FROM before_rows AS b WHERE b.state IN {WATCHED};
    ELSIF EXISTS (SELECT 1 FROM before_rows AS b WHERE b.state IN {WATCHED}) THEN
        -- Some old row was watched: every new row outside the watched states leaves the watch (a row that was not
        -- in it costs one probe).
        SELECT array_agg(a.occurrence_id) INTO gone_ids FROM after_rows AS a WHERE a.state NOT IN {WATCHED};
    END IF;
    IF gone_ids IS NOT NULL THEN
        DELETE FROM public.dispatch_occurrence_watch AS w WHERE w.occurrence_id = ANY (gone_ids);
    END IF;
    IF TG_OP = 'UPDATE' THEN
        -- Rows in the watched states now: written only where what the watch holds changed.
        INSERT INTO public.dispatch_occurrence_watch AS w (occurrence_id, scheduled_for, schedule_id, tenant_id,
                                                           state, attempt_count, lease_expires_at)
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
"""


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0018_occurrence_watch_follow_hashed")]

    # Backwards: 0017's reversal drops the function; until then this form is as correct as 0018's.
    operations = [migrations.RunSQL(FOLLOW, migrations.RunSQL.noop)]
