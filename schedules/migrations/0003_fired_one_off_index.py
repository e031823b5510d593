"""The one-offs whose fire was materialized and may still run: active with no cursor. The materializer's
maintenance pass completes them once their occurrence ended; this partial index keeps that pass to those few rows
among millions of schedules."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("schedules", "0002_created_index")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX IF NOT EXISTS schedule_fired_one_off ON schedules_schedule (id) "
            "WHERE state = 'active' AND next_run_at IS NULL",
            "DROP INDEX IF EXISTS schedule_fired_one_off",
        )
    ]
