"""Tenant quotas enforced by the engine: the dispatch rate, the running count and the catch-up rate.

Plain tables without Django models, like dispatch_tenant_retry_window: only dispatch/sql/quotas.py reads and
writes them, each with one conditional statement per batch, so a quota holds across every relay, worker and
materializer. No foreign keys to the tenant: they are counters, and deleting a tenant must not wait on them.

- dispatch_tenant_fire_bucket: the token bucket of max_fires_per_second, shared by every relay (tokens may go
  below zero by at most one envelope: an envelope is never split).
- dispatch_tenant_running: how many of the tenant's occurrences are running, changed in the same transaction as
  every move into or out of `running` (claim, completion, reaper, a side exit over an expired lease).
- dispatch_tenant_catchup_window: per tenant and UTC minute, how many catch-up fires were released in it.
"""

from django.db import migrations, models

CREATE = """
CREATE TABLE IF NOT EXISTS dispatch_tenant_fire_bucket (
    tenant_id bigint PRIMARY KEY,
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    rate integer NOT NULL,
    wanted bigint NOT NULL DEFAULT 0,
    last_granted bigint NOT NULL DEFAULT 0,
    throttled_fires bigint NOT NULL DEFAULT 0,
    dispatched_fires bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS dispatch_tenant_running (
    tenant_id bigint PRIMARY KEY,
    running integer NOT NULL CHECK (running >= 0),
    throttled_claims bigint NOT NULL DEFAULT 0
);
-- Occurrences already running when this migration runs are counted, so the quota is right from the first claim.
INSERT INTO dispatch_tenant_running (tenant_id, running)
SELECT tenant_id, count(*) FROM dispatch_occurrence WHERE state = 'running' GROUP BY tenant_id
ON CONFLICT (tenant_id) DO NOTHING;
CREATE TABLE IF NOT EXISTS dispatch_tenant_catchup_window (
    tenant_id bigint NOT NULL,
    window_start timestamptz NOT NULL,
    used integer NOT NULL CHECK (used >= 0),
    PRIMARY KEY (tenant_id, window_start)
);
"""

DROP = """
DROP TABLE IF EXISTS dispatch_tenant_fire_bucket;
DROP TABLE IF EXISTS dispatch_tenant_running;
DROP TABLE IF EXISTS dispatch_tenant_catchup_window;
"""


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0007_occurrence_kept")]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="throttled",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="throttled",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(("published_at__isnull", True)),
                fields=["queue", "tenant_id", "available_at", "-priority", "id"],
                name="outbox_due_by_tenant",
            ),
        ),
        migrations.RunSQL(CREATE, DROP),
    ]
