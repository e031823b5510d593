"""The table of the default cache (settings.CACHES, DatabaseCache "scheduler_cache"): the API throttle counters, which
every web process must share. The DDL is what `createcachetable` writes, made UNLOGGED: counters are cheap to lose
in a crash (a budget starts over) and not worth a WAL record per API request.

A migration rather than a `createcachetable` step, because `migrate` alone makes a fresh database ready (docs/API.md,
"Commands"). As
a migration of a shared app it runs in the public schema only, which every tenant's search path ends with.
"""

from django.db import migrations

CREATE = """
CREATE UNLOGGED TABLE IF NOT EXISTS scheduler_cache (
    cache_key varchar(255) NOT NULL PRIMARY KEY,
    value text NOT NULL,
    expires timestamp with time zone NOT NULL
);
CREATE INDEX IF NOT EXISTS scheduler_cache_expires ON scheduler_cache (expires);
"""


class Migration(migrations.Migration):
    dependencies = [("schedules", "0003_fired_one_off_index")]

    operations = [migrations.RunSQL(CREATE, "DROP TABLE IF EXISTS scheduler_cache")]
