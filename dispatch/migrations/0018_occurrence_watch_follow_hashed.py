"""The watch trigger's UPDATE branch back to a join the planner hashes (migration 0017's second form was quadratic).

0017 found the rows that left the watched states with NOT EXISTS over the statement's new rows, and the rows to write
with a LEFT JOIN of new to old rows: over transition tables (no statistics) PostgreSQL ran both as nested loops. With
EXPLAIN ANALYZE on 5,000 running rows: the settle's UPDATE of enqueued_at spent 3.5 s in the trigger, a completion
2.0 s; in a 30-minute steady run the bursts drained in 70-252 s and start lag p99 reached 135 s. This form (the old
and new rows joined on the key, then the watch probed; every watched new row upserted, a write only where what the
watch holds changed) costs 12-15 ms for the same statements.
"""

from django.db import migrations

WATCHED = "('running', 'retry_wait', 'dead')"

FOLLOW = f"""
CREATE OR REPLACE FUNCTION public.dispatch_occurrence_watch_follow() RETURNS trigger LANGUAGE plpgsql AS $$
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
        -- Rows that left the watched states: the statement's old and new rows joined on the key (hashed), then the
        -- watch probed for those only. No statement changes scheduled_for, so the key is the same on both sides.
        DELETE FROM public.dispatch_occurrence_watch AS w
        USING before_rows AS b
        JOIN after_rows AS a ON a.occurrence_id = b.occurrence_id AND a.scheduled_for = b.scheduled_for
        WHERE b.state IN {WATCHED} AND a.state NOT IN {WATCHED}
          AND w.occurrence_id = b.occurrence_id AND w.scheduled_for = b.scheduled_for;
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
    dependencies = [("dispatch", "0017_occurrence_watch")]

    # Backwards: 0017's function is what 0017's own reversal drops; leaving this one in place is harmless.
    operations = [migrations.RunSQL(FOLLOW, migrations.RunSQL.noop)]
