"""A note on each schedule version: why the actor made the change (an operator's pause, say).

A constant default, so PostgreSQL adds the column without rewriting the table (metadata only).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("schedules", "0005_tenant_schedule_count")]

    operations = [
        migrations.AddField(
            model_name="scheduleversion",
            name="note",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
    ]
