"""Tenancy: tenants, their host names and their quotas."""

from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants"

    def ready(self) -> None:
        from tenants import checks  # noqa: F401 - registers the deployment checks
