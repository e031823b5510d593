"""Tenancy: tenants, their host names and their quotas."""

from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from tenants import checks  # noqa: F401 - registers the deployment checks
        from tenants.access import ensure_operator_groups

        post_migrate.connect(ensure_operator_groups, sender=self, dispatch_uid="tenants.operator_groups")
