"""The settler's scan of stamped envelopes, one partial index per class of envelope (dispatch/sql/outbox.py
SMALL_ENVELOPE).

With one index for both classes, each statement of the small class walked past every big envelope stamped before its
own (a burst's thousands), fetching each row to test its class. Built and dropped CONCURRENTLY: the outbox is written
every second, and a plain CREATE INDEX would hold its writers for the whole build (DROP INDEX for its lock queue).
The new indexes come first, so the settler always has one to read.
"""

import django.db.models.lookups
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


def _small_envelope():
    fires = models.Func(models.F("occurrence_ids"), function="cardinality", output_field=models.IntegerField())
    return django.db.models.lookups.LessThanOrEqual(fires, 16)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("dispatch", "0015_hot_table_fillfactor")]

    operations = [
        AddIndexConcurrently(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(published_at__isnull=False) & models.Q(_small_envelope()),
                fields=["published_at"],
                name="outbox_published_small",
            ),
        ),
        AddIndexConcurrently(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(published_at__isnull=False) & ~models.Q(_small_envelope()),
                fields=["published_at"],
                name="outbox_published_big",
            ),
        ),
        RemoveIndexConcurrently(model_name="outboxmessage", name="outbox_published"),
    ]
