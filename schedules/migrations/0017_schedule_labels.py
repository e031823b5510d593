"""Schedule labels (core/labels.py): a jsonb object on every schedule, '{}' for the existing ones, and a GIN index
for selectors' `key=value` containment.

Safe on a table of 20 M schedules: a column with a constant default only writes the catalog (no table rewrite), and
every lock waits at most 5 s (run the migration again once a long transaction has ended). The index build holds the
schedule table's writers while it reads the table: on a large installation build it beforehand, outside any
transaction, with `CREATE INDEX CONCURRENTLY IF NOT EXISTS schedule_labels ON schedules_schedule USING gin (labels
jsonb_path_ops)`; this migration then finds it and only records it.
"""

import django.contrib.postgres.indexes
from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"
CREATE_INDEX = (
    "CREATE INDEX IF NOT EXISTS schedule_labels ON schedules_schedule USING gin (labels jsonb_path_ops)"
)


class Migration(migrations.Migration):
    dependencies = [("schedules", "0016_api_rate_counters")]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        migrations.AddField(
            model_name="schedule",
            name="labels",
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(CREATE_INDEX, "DROP INDEX IF EXISTS schedule_labels")],
            state_operations=[
                migrations.AddIndex(
                    model_name="schedule",
                    index=django.contrib.postgres.indexes.GinIndex(
                        fields=["labels"], name="schedule_labels", opclasses=["jsonb_path_ops"]
                    ),
                )
            ],
        ),
    ]
