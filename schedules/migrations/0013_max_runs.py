"""A limited number of runs: `max_runs` on the schedule (its definition), and the count left, `remaining_runs`, on
the schedule (while it is not active) and on its cursor (while it is: the materializer takes one per fire it writes).
Null is no limit, what every schedule had before.

Safe on a table of 20 M schedules: nullable columns without a default only write the catalog, and each ALTER TABLE
waits at most 5 s for its lock (run the migration again once a long transaction has ended). Schedule first, then
cursor: the control plane's own lock order.
"""

from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


class Migration(migrations.Migration):
    dependencies = [("schedules", "0012_schedule_window")]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        migrations.AddField(
            model_name="schedule", name="max_runs", field=models.PositiveIntegerField(blank=True, null=True)
        ),
        migrations.AddField(
            model_name="schedule",
            name="remaining_runs",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="schedulecursor", name="remaining_runs", field=models.IntegerField(blank=True, null=True)
        ),
    ]
