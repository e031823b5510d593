"""An envelope's created_at defaults to PostgreSQL's clock, so the materializer can write envelopes by COPY.

One INSERT statement per envelope was ~134,000 statements a minute at the seed's steady rate (docs/BENCHMARKS.md,
"Steady load"). Setting a default changes only the catalog; the short lock of the table is given up after 5 s rather
than queueing the relay behind it.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0013_outbox_leases")]

    operations = [
        migrations.RunSQL("SET LOCAL lock_timeout = '5s'", migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="outboxmessage",
            name="created_at",
            field=models.DateTimeField(
                db_default=models.Func(function="clock_timestamp", output_field=models.DateTimeField())
            ),
        ),
    ]
