"""A schedule's window, `start_at` and `end_at`, on the schedule and on its cursor (the materializer plans from the
cursor's copy, and the maintenance pass completes a schedule once its end_at has passed). Null is unbounded, what
every schedule had before.

Safe on a table of 20 M schedules: nullable columns without a default only write the catalog, and each ALTER TABLE
waits at most 5 s for its lock (run the migration again once a long transaction has ended). Schedule first, then
cursor: the control plane's own lock order.
"""

from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


class Migration(migrations.Migration):
    dependencies = [("schedules", "0011_dst_policy")]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        *(
            migrations.AddField(model_name=model, name=name, field=models.DateTimeField(blank=True, null=True))
            for model in ("schedule", "schedulecursor")
            for name in ("start_at", "end_at")
        ),
    ]
