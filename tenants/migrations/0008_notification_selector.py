"""A notification target's label selector (core/labels.py): its text as the tenant gave it in normal form, and the
parsed form the data plane's SQL applies. Both empty for the existing targets: every schedule, as before."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tenants", "0007_notification_target")]

    operations = [
        migrations.AddField(
            model_name="notificationtarget",
            name="selector",
            field=models.CharField(blank=True, db_default="", default="", max_length=2000),
        ),
        migrations.AddField(
            model_name="notificationtarget",
            name="selector_match",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
