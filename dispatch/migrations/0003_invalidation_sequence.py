"""A counter that moves whenever unclaimed occurrences are withdrawn (update, pause, cancel).

The relay reads it (one cheap, lock-free read) before publishing envelopes it staged a moment earlier; only
when it moved does the relay look for staged envelopes whose occurrences were all withdrawn meanwhile.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0002_process_heartbeat")]

    operations = [
        migrations.RunSQL(
            "CREATE SEQUENCE IF NOT EXISTS dispatch_invalidation_seq",
            "DROP SEQUENCE IF EXISTS dispatch_invalidation_seq",
        )
    ]
