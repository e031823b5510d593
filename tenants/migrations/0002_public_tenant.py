"""The platform's own tenant row: the public schema and the hosts that serve the operator console."""

from django.conf import settings
from django.db import migrations


def create_public_tenant(apps, schema_editor):
    Tenant = apps.get_model("tenants", "Tenant")
    Domain = apps.get_model("tenants", "Domain")
    tenant, _ = Tenant.objects.get_or_create(
        schema_name="public", defaults={"slug": "public", "name": "Platform operators"}
    )
    for index, host in enumerate(settings.SCHEDULER_PUBLIC_HOSTS):
        Domain.objects.get_or_create(domain=host, defaults={"tenant": tenant, "is_primary": index == 0})


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]

    operations = [migrations.RunPython(create_public_tenant, migrations.RunPython.noop)]
