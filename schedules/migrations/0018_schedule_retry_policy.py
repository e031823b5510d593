"""A schedule's retry policy: the base and the cap of its backoff between attempts (dispatch/engine/retry.py). Null,
what every schedule has until it says otherwise, is the platform's settings.

Safe on a table of 20 M schedules: nullable columns without a default or a CHECK (the ranges are the services')
only write the catalog, and the ALTER TABLE waits at most 5 s for its lock (run the migration again once a long
transaction has ended).
"""

from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


class Migration(migrations.Migration):
    dependencies = [("schedules", "0017_schedule_labels")]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        migrations.AddField(
            model_name="schedule",
            name="retry_base_seconds",
            field=models.IntegerField(
                blank=True,
                null=True,
                help_text="Seconds; the first retry waits between half and all of it. Empty: the platform's default.",
            ),
        ),
        migrations.AddField(
            model_name="schedule",
            name="retry_cap_seconds",
            field=models.IntegerField(
                blank=True,
                null=True,
                help_text="The longest backoff between attempts, in seconds (the tenant's retry budget may delay a retry further). Empty: the platform's default.",
            ),
        ),
    ]
