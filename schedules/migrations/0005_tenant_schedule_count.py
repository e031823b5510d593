"""The schedule-count quota as a counter per tenant (active + paused schedules), kept by triggers.

The quota check used to count the tenant's schedules under its row lock: O(N) for a tenant near a quota of 100,000
on every create. The counter is kept by the database itself, so every writer is counted the same way: the API, the
materializer completing one-offs in bulk, the console, a benchmark's COPY.
- inserts and deletes: statement triggers with transition tables (one aggregated upsert per statement, so a COPY of
  millions of rows costs one update, not one per row), tenants in tenant_id order;
- state changes: a row trigger whose WHEN clause lets every update that leaves the counted-or-not status alone (the
  materializer's cursor updates) through without calling anything.
"""

from django.db import migrations

COUNTED = "('active', 'paused')"

CREATE = f"""
CREATE TABLE IF NOT EXISTS schedules_tenant_schedule_count (
    tenant_id bigint PRIMARY KEY,
    held bigint NOT NULL
);
INSERT INTO schedules_tenant_schedule_count (tenant_id, held)
SELECT tenant_id, count(*) FROM schedules_schedule WHERE state IN {COUNTED} GROUP BY tenant_id
ON CONFLICT (tenant_id) DO NOTHING;

CREATE OR REPLACE FUNCTION schedules_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO schedules_tenant_schedule_count AS c (tenant_id, held)
    SELECT tenant_id, count(*) FROM new_rows WHERE state IN {COUNTED} GROUP BY tenant_id ORDER BY tenant_id
    ON CONFLICT (tenant_id) DO UPDATE SET held = c.held + EXCLUDED.held;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION schedules_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE schedules_tenant_schedule_count AS c SET held = GREATEST(0, c.held - d.held)
    FROM (SELECT tenant_id, count(*) AS held FROM old_rows WHERE state IN {COUNTED}
          GROUP BY tenant_id ORDER BY tenant_id) AS d
    WHERE c.tenant_id = d.tenant_id;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION schedules_count_state_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO schedules_tenant_schedule_count AS c (tenant_id, held)
    VALUES (NEW.tenant_id, CASE WHEN NEW.state IN {COUNTED} THEN 1 ELSE 0 END)
    ON CONFLICT (tenant_id) DO UPDATE
    SET held = GREATEST(0, c.held + CASE WHEN NEW.state IN {COUNTED} THEN 1 ELSE -1 END);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS schedules_count_insert ON schedules_schedule;
CREATE TRIGGER schedules_count_insert AFTER INSERT ON schedules_schedule
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION schedules_count_inserted();
DROP TRIGGER IF EXISTS schedules_count_delete ON schedules_schedule;
CREATE TRIGGER schedules_count_delete AFTER DELETE ON schedules_schedule
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION schedules_count_deleted();
DROP TRIGGER IF EXISTS schedules_count_state ON schedules_schedule;
CREATE TRIGGER schedules_count_state AFTER UPDATE OF state ON schedules_schedule FOR EACH ROW
    WHEN ((OLD.state IN {COUNTED}) IS DISTINCT FROM (NEW.state IN {COUNTED}))
    EXECUTE FUNCTION schedules_count_state_changed();
"""

DROP = """
DROP TRIGGER IF EXISTS schedules_count_insert ON schedules_schedule;
DROP TRIGGER IF EXISTS schedules_count_delete ON schedules_schedule;
DROP TRIGGER IF EXISTS schedules_count_state ON schedules_schedule;
DROP FUNCTION IF EXISTS schedules_count_inserted();
DROP FUNCTION IF EXISTS schedules_count_deleted();
DROP FUNCTION IF EXISTS schedules_count_state_changed();
DROP TABLE IF EXISTS schedules_tenant_schedule_count;
"""


class Migration(migrations.Migration):
    dependencies = [("schedules", "0004_cache_table")]

    operations = [migrations.RunSQL(CREATE, DROP)]
