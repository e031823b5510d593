"""The tenant-schema app of API tokens (settings.TENANT_APPS): its table exists in every tenant's schema and in no
other, so a token can only ever authenticate on its own tenant's host."""

from django.apps import AppConfig


class CredentialsConfig(AppConfig):
    name = "tenants.credentials"
    label = "credentials"
    verbose_name = "API credentials"
    default_auto_field = "django.db.models.BigAutoField"
