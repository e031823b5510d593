"""The API's request counters (schedules/api/throttles.py): one row per budget (a token, a tenant, a client address),
counted by one INSERT ... ON CONFLICT DO UPDATE per request, so parallel requests can never both pass the last place
(DRF's counters in the cache were a read, then a write: 150 parallel requests let 94 through a budget of 50). UNLOGGED
like the cache table before it: counters are cheap to lose in a crash (a budget starts over) and not worth a WAL
record per API request. As a migration of a shared app it runs in the public schema only, which every tenant's
search path ends with.
"""

from django.db import migrations

CREATE = """
CREATE UNLOGGED TABLE IF NOT EXISTS api_rate_counter (
    key text NOT NULL PRIMARY KEY,
    window_start timestamp with time zone NOT NULL,
    count integer NOT NULL
);
"""


class Migration(migrations.Migration):
    dependencies = [("schedules", "0015_calendars")]

    operations = [migrations.RunSQL(CREATE, "DROP TABLE IF EXISTS api_rate_counter")]
