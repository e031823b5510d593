"""Schedules of kind `interval`: `every_seconds` and `anchor_at` on the schedule and on its cursor (the materializer
plans from the cursor's copy), and the kind rule `schedule_kind_has_time` widened to them.

Safe on a table of 20 M schedules:
- The columns are nullable without a default: adding one only writes the catalog, however many rows there are.
- The kind rule is a CHECK constraint. Replacing it with a plain ADD CONSTRAINT would read every row to validate it
  while holding the ACCESS EXCLUSIVE lock of the ALTER TABLE: every API write and every materializer batch would
  wait for that scan. Here the new rule is added NOT VALID (new and updated rows are checked at once, existing ones
  are not read), in this migration's short transaction; migration 0009 validates it in a transaction of its own,
  under a SHARE UPDATE EXCLUSIVE lock that lets reads and writes go on during the scan.
- Each ALTER TABLE waits at most 5 s for its lock (a long transaction holding a schedule or a cursor row) instead
  of queueing every schedule write and materializer batch behind it; run the migration again once that
  transaction has ended. The tables are locked schedule first, then cursor: the control plane's own order.

Rolling it back drops the columns and restores the old rule; with interval schedules present the old rule fails on
them (cancel and delete those first).
"""

from django.db import migrations, models

KIND_HAS_TIME = models.CheckConstraint(
    condition=models.Q(
        models.Q(("cron__isnull", False), ("kind", "cron")),
        models.Q(("kind", "once"), ("run_at__isnull", False)),
        models.Q(
            ("anchor_at__isnull", False),
            ("every_seconds__gte", 1),
            ("every_seconds__isnull", False),
            ("kind", "interval"),
        ),
        _connector="OR",
    ),
    name="schedule_kind_has_time",
)
OLD_KIND_HAS_TIME = """
((cron IS NOT NULL AND kind = 'cron') OR (kind = 'once' AND run_at IS NOT NULL))
"""
NEW_KIND_HAS_TIME = """
((cron IS NOT NULL AND kind = 'cron') OR (kind = 'once' AND run_at IS NOT NULL)
 OR (anchor_at IS NOT NULL AND every_seconds >= 1 AND every_seconds IS NOT NULL AND kind = 'interval'))
"""

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"
SWAP_RULE = f"""
ALTER TABLE schedules_schedule
    DROP CONSTRAINT IF EXISTS schedule_kind_has_time,
    ADD CONSTRAINT schedule_kind_has_time CHECK {NEW_KIND_HAS_TIME} NOT VALID
"""
RESTORE_RULE = f"""
ALTER TABLE schedules_schedule
    DROP CONSTRAINT IF EXISTS schedule_kind_has_time,
    ADD CONSTRAINT schedule_kind_has_time CHECK {OLD_KIND_HAS_TIME}
"""
KINDS = [("cron", "Cron"), ("once", "Once"), ("interval", "Interval")]


class Migration(migrations.Migration):
    dependencies = [
        ("schedules", "0007_schedule_cursor"),
        ("tenants", "0004_quota_help_texts"),
    ]

    operations = [
        # First, so that every ALTER TABLE below gives up after 5 s of waiting (both directions).
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        migrations.AddField(
            model_name="schedule", name="every_seconds", field=models.IntegerField(blank=True, null=True)
        ),
        migrations.AddField(model_name="schedule", name="anchor_at", field=models.DateTimeField(blank=True, null=True)),
        migrations.AlterField(model_name="schedule", name="kind", field=models.CharField(choices=KINDS, max_length=8)),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="schedule", name="schedule_kind_has_time"),
                migrations.AddConstraint(model_name="schedule", constraint=KIND_HAS_TIME),
            ],
            database_operations=[migrations.RunSQL(SWAP_RULE, RESTORE_RULE)],
        ),
        migrations.AddField(
            model_name="schedulecursor", name="every_seconds", field=models.IntegerField(blank=True, null=True)
        ),
        migrations.AddField(
            model_name="schedulecursor", name="anchor_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.AlterField(
            model_name="schedulecursor", name="kind", field=models.CharField(choices=KINDS, max_length=8)
        ),
    ]
