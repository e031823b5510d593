"""Validate the kind rule that migration 0008 added NOT VALID, in a transaction of its own.

VALIDATE CONSTRAINT reads every schedule under a SHARE UPDATE EXCLUSIVE lock, which blocks no read and no write
(only other schema changes and VACUUM), so the API and the materializer go on during the scan of a 20 M-row table.
It waits at most 5 s for that lock (another schema change, a running VACUUM) rather than queueing behind it; run
the migration again later if it gave up. Until then the rule already holds for every new or changed row.
"""

from django.db import migrations

VALIDATE = """
SET LOCAL lock_timeout = '5s';
ALTER TABLE schedules_schedule VALIDATE CONSTRAINT schedule_kind_has_time
"""


class Migration(migrations.Migration):
    dependencies = [("schedules", "0008_interval_kind")]

    operations = [migrations.RunSQL(VALIDATE, migrations.RunSQL.noop)]
