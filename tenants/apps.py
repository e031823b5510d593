"""Tenancy: tenants, their host names and their quotas."""

from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants"
