"""Which tenants a console user may see and act on: the one rule every console list, filter, action, page and
dashboard figure applies (docs/GUARANTEES.md, "Security").

A superuser, and an operator whose OperatorAccess says `all_tenants`, see every tenant (None below). Any other
staff user sees only the tenants assigned to them, and none without an assignment: access is granted, never
assumed. What each may do within those tenants is Django's permissions, given by two groups kept after
every migrate (ensure_operator_groups): "Read-only operator" (view) and "Operator" (view, change schedules,
replay).
"""

from __future__ import annotations

from collections.abc import Collection

from django.apps import apps
from django.contrib.auth.management import create_permissions
from django.db import connection
from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.models import OperatorAccess

READ_ONLY_GROUP = "Read-only operator"
OPERATOR_GROUP = "Operator"
# (app label, codename) of each group's permissions; the platform's own settings (tenants, quotas) stay with
# superusers.
READ_ONLY_PERMISSIONS = (
    ("schedules", "view_schedule"),
    ("schedules", "view_calendar"),
    ("dispatch", "view_occurrence"),
    ("dispatch", "view_attempt"),
    ("tenants", "view_tenant"),
)
OPERATOR_PERMISSIONS = (
    *READ_ONLY_PERMISSIONS,
    ("schedules", "change_schedule"),
    ("dispatch", "change_occurrence"),
)

_CACHE_ATTRIBUTE = "_scheduler_tenant_scope"


def tenant_scope(request: HttpRequest) -> frozenset[int] | None:
    """The ids of the tenants the request's user may see, or None for every tenant. Read once per request."""
    if hasattr(request, _CACHE_ATTRIBUTE):
        return getattr(request, _CACHE_ATTRIBUTE)
    user = request.user
    scope: frozenset[int] | None
    if not user.is_authenticated or not user.is_active:
        scope = frozenset()
    elif user.is_superuser:
        scope = None
    else:
        access = OperatorAccess.objects.filter(user_id=user.pk).first()
        if access is None:
            scope = frozenset()
        elif access.all_tenants:
            scope = None
        else:
            scope = frozenset(access.tenants.values_list("pk", flat=True))
    setattr(request, _CACHE_ATTRIBUTE, scope)
    return scope


def scoped(request: HttpRequest, queryset: QuerySet, field: str = "tenant_id") -> QuerySet:
    """The rows of `queryset` whose `field` names a tenant the user may see."""
    scope = tenant_scope(request)
    return queryset if scope is None else queryset.filter(**{f"{field}__in": scope})


def sees_every_tenant(request: HttpRequest) -> bool:
    return tenant_scope(request) is None


def scope_list(scope: Collection[int] | None) -> list[int] | None:
    """The scope as an SQL parameter: None (every tenant) or a list for `= ANY(%s)`."""
    return None if scope is None else sorted(scope)


def ensure_operator_groups(using: str = "default", **kwargs: object) -> None:
    """The two operator groups with exactly their permissions (post_migrate, public schema only: the console's)."""
    from django.contrib.auth.models import Group, Permission

    if connection.schema_name != "public":
        return
    for label in {app for app, _ in OPERATOR_PERMISSIONS}:
        # The permissions of apps migrated after this one may not exist yet: make them now (idempotent).
        create_permissions(apps.get_app_config(label), verbosity=0, using=using)
    for name, wanted in ((READ_ONLY_GROUP, READ_ONLY_PERMISSIONS), (OPERATOR_GROUP, OPERATOR_PERMISSIONS)):
        group, _ = Group.objects.using(using).get_or_create(name=name)
        permissions = [
            Permission.objects.using(using).get(content_type__app_label=app, codename=codename)
            for app, codename in wanted
        ]
        group.permissions.set(permissions)
