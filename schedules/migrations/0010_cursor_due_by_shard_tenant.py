"""The materializer's due scan orders one instant's cursors by tenant (dispatch/sql/materialize.py SCAN_DUE_SCHEDULES):
the index gains tenant_id after next_run_at, so the scan stays an ordered index range per shard with no sort.

The lock waits at most 5 s, like every upkeep statement, and the migration fails (to be run again) rather than queue
every schedule write behind it. The build holds the cursor table's writers while it runs. Not CONCURRENTLY: a new
tenant's migrations run in one transaction, and a concurrent build waits for every older transaction without a bound.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("schedules", "0009_validate_kind_has_time")]

    operations = [
        migrations.RunSQL("SET LOCAL lock_timeout = '5s'", migrations.RunSQL.noop),
        migrations.AddIndex(
            model_name="schedulecursor",
            index=models.Index(
                condition=models.Q(next_run_at__isnull=False),
                fields=["shard", "next_run_at", "tenant_id"],
                name="cursor_due_by_shard_tenant",
            ),
        ),
        migrations.RemoveIndex(model_name="schedulecursor", name="cursor_due_by_shard"),
    ]
