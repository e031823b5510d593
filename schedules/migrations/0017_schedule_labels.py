"""Schedule labels (core/labels.py): a jsonb object on every schedule, '{}' for the existing ones.

Safe on a table of 20 M schedules: a column with a constant default only writes the catalog (no table rewrite), and
the ALTER TABLE waits at most 5 s for its lock (run the migration again once a long transaction has ended). The
selectors' index is built concurrently by its own migration (0020), outside this one's lock.
"""

from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


class Migration(migrations.Migration):
    dependencies = [("schedules", "0016_api_rate_counters")]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        migrations.AddField(
            model_name="schedule",
            name="labels",
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
    ]
