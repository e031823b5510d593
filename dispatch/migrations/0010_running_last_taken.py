"""dispatch_tenant_running.last_taken: how many running slots the last batched claim was granted (RETURNING shows
only new values, so the grant is stored by the same statement and read back; see TAKE_RUNNING_SLOTS_MANY)."""

from django.db import migrations

ADD = "ALTER TABLE dispatch_tenant_running ADD COLUMN IF NOT EXISTS last_taken integer NOT NULL DEFAULT 0"
DROP = "ALTER TABLE dispatch_tenant_running DROP COLUMN IF EXISTS last_taken"


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0009_metric_counters")]

    operations = [migrations.RunSQL(ADD, DROP)]
