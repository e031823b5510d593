"""Metrics that every process adds to and /metrics reads: one total for all processes on all hosts.

- dispatch_metric_counter: one row per metric sample (name + labels), only ever added to (`value = value + delta`)
  by dispatch/counters.py's flushes and by the relay's settle step (the enqueue lag histogram). Labels are jsonb,
  so Python and SQL writers meet on the same key whatever order or spacing their JSON text had.
- dispatch_metric_tenant_series: the tenants that have lag series of their own (the busiest, bounded); every
  other tenant's fires are counted under tenant="other".
- dispatch_processheartbeat.clock_skew_seconds: the process's wall clock minus PostgreSQL's at its last heartbeat.
"""

from django.db import migrations, models

CREATE = """
CREATE TABLE IF NOT EXISTS dispatch_metric_counter (
    name text NOT NULL,
    labels jsonb NOT NULL DEFAULT '{}'::jsonb,
    value double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (name, labels)
);
CREATE TABLE IF NOT EXISTS dispatch_metric_tenant_series (
    tenant_id bigint PRIMARY KEY,
    slug text NOT NULL,
    ranked_at timestamptz NOT NULL
);
"""

DROP = """
DROP TABLE IF EXISTS dispatch_metric_counter;
DROP TABLE IF EXISTS dispatch_metric_tenant_series;
"""


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0008_tenant_quotas")]

    operations = [
        migrations.RunSQL(CREATE, DROP),
        migrations.AddField(
            model_name="processheartbeat",
            name="clock_skew_seconds",
            field=models.FloatField(null=True, blank=True),
        ),
    ]
