"""Pause until: `resume_at` on the schedule (while paused, when it resumes by itself), and a partial index of the
rows that have one, which the maintenance pass reads for the pauses due to end.

On a table of 20 M schedules: the column is nullable without a default (a catalog write). The index is built in the
migration's transaction, not CONCURRENTLY (a tenant's migrations run in one transaction): the build reads the table
once under a SHARE lock, so schedule writes (API changes) wait for it, while the data plane, which writes cursors,
occurrences and the outbox, goes on. Each statement waits at most 5 s for its lock instead of queueing every
schedule write behind a long transaction; run the migration again once that transaction has ended.
"""

from django.db import migrations, models

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


class Migration(migrations.Migration):
    dependencies = [("schedules", "0013_max_runs")]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        migrations.AddField(
            model_name="schedule",
            name="resume_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddIndex(
            model_name="schedule",
            index=models.Index(
                condition=models.Q(("resume_at__isnull", False)), fields=["resume_at"], name="schedule_resume_due"
            ),
        ),
    ]
