"""The settler's scan of stamped envelopes, one partial index per class of envelope (dispatch/sql/outbox.py
SMALL_ENVELOPE).

With one index for both classes, each statement of the small class walked past every big envelope stamped before its
own (a burst's thousands), fetching each row to test its class. The outbox holds about a minute of envelopes, so the
build takes a moment; its lock waits at most 5 s, like every upkeep statement, and the migration fails (to be run
again) rather than queue every write behind it. Not CONCURRENTLY: a new tenant's migrations run in one transaction.
"""

import django.db.models.lookups
from django.db import migrations, models


def _small_envelope():
    fires = models.Func(models.F("occurrence_ids"), function="cardinality", output_field=models.IntegerField())
    return django.db.models.lookups.LessThanOrEqual(fires, 16)


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0015_hot_table_fillfactor")]

    operations = [
        migrations.RunSQL("SET LOCAL lock_timeout = '5s'", migrations.RunSQL.noop),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(published_at__isnull=False) & models.Q(_small_envelope()),
                fields=["published_at"],
                name="outbox_published_small",
            ),
        ),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(published_at__isnull=False) & ~models.Q(_small_envelope()),
                fields=["published_at"],
                name="outbox_published_big",
            ),
        ),
        migrations.RemoveIndex(model_name="outboxmessage", name="outbox_published"),
    ]
