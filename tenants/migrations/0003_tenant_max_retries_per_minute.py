"""The tenant's retry budget: retries per minute the workers grant it (dispatch/engine/retry.py), 0 = unlimited.

A database default too, so a tenant row written by anything but this model (a script, a restore) is unlimited
rather than an error.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tenants", "0002_public_tenant")]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="max_retries_per_minute",
            field=models.PositiveIntegerField(
                db_default=0,
                default=0,
                help_text="Retries of failed attempts this tenant may run per minute; more are delayed, not dropped. "
                "0 = unlimited.",
            ),
        ),
    ]
