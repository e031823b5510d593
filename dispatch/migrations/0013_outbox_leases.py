"""Outbox envelopes carry a relay lease (owner, expiry) and the backoff of their refused publishes.

The relay used to keep the claim transaction open while its messages were in flight: a broker memory alarm held
envelope row locks and a snapshot ("idle in transaction") for the whole alarm. The lease replaces the row lock. The
columns are nullable or have a database default, so adding them rewrites nothing; the short lock of the table is
given up after 5 s rather than queueing the relay behind it.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0012_outbox_lz4")]

    operations = [
        migrations.RunSQL("SET LOCAL lock_timeout = '5s'", migrations.RunSQL.noop),
        migrations.AddField(
            model_name="outboxmessage",
            name="lease_owner",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="lease_expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="publish_failures",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="retry_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
