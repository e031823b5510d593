"""The tenants' retry budget: per tenant and UTC minute, how many retries the workers granted to run in it.

A plain table without a Django model: only dispatch/sql/claims.py (RETRY_BUDGET, TAKE_RETRY_SLOT,
PRUNE_RETRY_WINDOWS) reads and writes it, with one conditional upsert per slot, so the cap holds across every worker.
Rows of minutes long past are deleted by the lease reaper's pass. No foreign key to the tenant: the row is a
counter, and deleting a tenant must not wait on it.
"""

from django.db import migrations

CREATE = """
CREATE TABLE IF NOT EXISTS dispatch_tenant_retry_window (
    tenant_id bigint NOT NULL,
    window_start timestamptz NOT NULL,
    used integer NOT NULL CHECK (used > 0),
    PRIMARY KEY (tenant_id, window_start)
)
"""


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0005_attempt_generation_unique"), ("tenants", "0003_tenant_max_retries_per_minute")]

    operations = [migrations.RunSQL(CREATE, "DROP TABLE IF EXISTS dispatch_tenant_retry_window")]
