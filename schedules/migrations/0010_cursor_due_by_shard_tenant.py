"""The materializer's due scan orders one instant's cursors by tenant (dispatch/sql/materialize.py SCAN_DUE_SCHEDULES):
the index gains tenant_id after next_run_at, so the scan stays an ordered index range per shard with no sort.

Built and dropped CONCURRENTLY: the cursor table is written at every fire, and a plain CREATE INDEX would hold the
materializer and every schedule change for the whole build (DROP INDEX for its lock queue). The new index comes
first, so the scan always has one to read.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("schedules", "0009_validate_kind_has_time")]

    operations = [
        AddIndexConcurrently(
            model_name="schedulecursor",
            index=models.Index(
                condition=models.Q(next_run_at__isnull=False),
                fields=["shard", "next_run_at", "tenant_id"],
                name="cursor_due_by_shard_tenant",
            ),
        ),
        RemoveIndexConcurrently(model_name="schedulecursor", name="cursor_due_by_shard"),
    ]
