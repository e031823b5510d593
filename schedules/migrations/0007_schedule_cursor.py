"""The cursor moves to a narrow table of its own (ScheduleCursor): the materializer updates one cursor per fire, and
on the schedule row each update rewrote a wide row and six index entries (docs/DESIGN.md, "The materializer's batch,
and the cursor table").

Every active schedule gets its cursor row, with the definition the materializer plans from; then the schedule's own
column and its two indexes go.
"""

import django.db.models.deletion
from django.db import migrations, models

PLANNING = (
    "kind, cron, run_at, timezone, lane, flexible_window_seconds, priority, misfire_policy, max_lateness_seconds, "
    "catchup_limit"
)

COPY_CURSORS = f"""
INSERT INTO schedules_schedulecursor (schedule_id, tenant_id, shard, version, next_run_at, {PLANNING})
SELECT id, tenant_id, shard, version, next_run_at, {PLANNING}
FROM schedules_schedule WHERE state = 'active'
"""

COPY_BACK = """
UPDATE schedules_schedule AS s SET next_run_at = c.next_run_at
FROM schedules_schedulecursor AS c WHERE c.schedule_id = s.id
"""


class Migration(migrations.Migration):
    dependencies = [("schedules", "0006_scheduleversion_note")]

    operations = [
        migrations.CreateModel(
            name="ScheduleCursor",
            fields=[
                (
                    "schedule",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="cursor",
                        serialize=False,
                        to="schedules.schedule",
                    ),
                ),
                ("tenant_id", models.BigIntegerField()),
                ("shard", models.PositiveIntegerField()),
                ("version", models.PositiveIntegerField()),
                ("next_run_at", models.DateTimeField(blank=True, null=True)),
                ("kind", models.CharField(choices=[("cron", "Cron"), ("once", "Once")], max_length=8)),
                ("cron", models.CharField(blank=True, max_length=200, null=True)),
                ("run_at", models.DateTimeField(blank=True, null=True)),
                ("timezone", models.CharField(max_length=64)),
                ("lane", models.CharField(choices=[("strict", "Strict"), ("flexible", "Flexible")], max_length=8)),
                ("flexible_window_seconds", models.PositiveIntegerField()),
                ("priority", models.SmallIntegerField()),
                (
                    "misfire_policy",
                    models.CharField(
                        choices=[("skip", "Skip"), ("fire_once", "Fire Once"), ("catch_up", "Catch Up")],
                        max_length=16,
                    ),
                ),
                ("max_lateness_seconds", models.PositiveIntegerField()),
                ("catchup_limit", models.PositiveIntegerField()),
            ],
        ),
        migrations.AddIndex(
            model_name="schedulecursor",
            index=models.Index(
                condition=models.Q(("next_run_at__isnull", False)),
                fields=["shard", "next_run_at"],
                name="cursor_due_by_shard",
            ),
        ),
        migrations.AddIndex(
            model_name="schedulecursor",
            index=models.Index(
                condition=models.Q(("next_run_at__isnull", True)), fields=["schedule"], name="cursor_fired_one_off"
            ),
        ),
        migrations.RunSQL(COPY_CURSORS, COPY_BACK),
        migrations.RunSQL(
            "DROP INDEX IF EXISTS schedule_fired_one_off",
            "CREATE INDEX IF NOT EXISTS schedule_fired_one_off ON schedules_schedule (id) "
            "WHERE state = 'active' AND next_run_at IS NULL",
        ),
        migrations.RemoveIndex(model_name="schedule", name="schedule_due_by_shard"),
        migrations.RemoveField(model_name="schedule", name="next_run_at"),
    ]
