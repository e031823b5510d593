"""A cron schedule's DST policy: `dst_gap` and `dst_repeat` on the schedule and on its cursor (the materializer plans
from the cursor's copy). Null is the policy every schedule had before (skip, first), so existing rows need nothing.

Safe on a table of 20 M schedules: the columns are nullable without a default, so adding one only writes the
catalog, and each ALTER TABLE waits at most 5 s for its lock instead of queueing every schedule write and
materializer batch behind a long transaction (run the migration again once it has ended). Schedule first, then
cursor: the control plane's own lock order.
"""

from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"
GAP = [("skip", "Skip"), ("shift", "Shift")]
REPEAT = [("first", "First"), ("last", "Last"), ("both", "Both")]


class Migration(migrations.Migration):
    dependencies = [("schedules", "0010_cursor_due_by_shard_tenant")]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        *(
            migrations.AddField(
                model_name=model,
                name=name,
                field=models.CharField(blank=True, choices=choices, max_length=8, null=True),
            )
            for model in ("schedule", "schedulecursor")
            for name, choices in (("dst_gap", GAP), ("dst_repeat", REPEAT))
        ),
    ]
