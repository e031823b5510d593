"""The console's index lists what operators use: the platform's security tables for superusers only, and nothing of
apps whose tables stay empty here.

Called by scheduler_project/urls_public.py once every app's admin module has registered its models.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib import admin
from django.http import HttpRequest

# Models on the index of superusers only: operator groups (tenants/access.py grants them), and django-axes' login
# attempts, failures and logs. Their pages stay where they are for whoever has the permission to open them.
SUPERUSER_LISTED = ("auth.Group", "axes.AccessAttempt", "axes.AccessFailureLog", "axes.AccessLog")
# Apps listed for nobody: every task the workers run ignores its result (dispatch/tasks.py), so django-celery-results'
# task and group results never hold a row.
NEVER_LISTED_APPS = ("django_celery_results",)


class SuperuserListed:
    """Mixed into a model's admin: the index (and its app's index) lists the model for superusers only."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)


def tidy_index(site: admin.AdminSite) -> None:
    """Unregister the never-listed apps' models and make the superuser-listed ones so; idempotent."""
    for label in NEVER_LISTED_APPS:
        if apps.is_installed(label):
            for model in apps.get_app_config(label).get_models():
                if site.is_registered(model):
                    site.unregister(model)
    for name in SUPERUSER_LISTED:
        try:
            model = apps.get_model(name)
        except LookupError:
            continue
        if not site.is_registered(model):
            continue
        current = type(site.get_model_admin(model))
        if issubclass(current, SuperuserListed):
            continue
        listed: type[Any] = type(f"SuperuserListed{current.__name__}", (SuperuserListed, current), {})
        site.unregister(model)
        site.register(model, listed)
