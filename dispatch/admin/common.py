"""What the data plane's admin pages share: instants to the millisecond, an attempt's times, and read-only access."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from scheduler_project.console import SafeActionSelectionMixin


def precise_utc(value: datetime | None) -> str:
    """Milliseconds matter here: enqueue lag is judged against a 5-second budget."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def utc_column(field: str, description: str, *, ordering: str | None = None) -> Callable[[Any, Any], str]:
    """An admin column (or read-only field) showing the instant `field` of a row with precise_utc."""

    @admin.display(description=description, ordering=ordering)
    def column(admin_self: Any, row: Any) -> str:
        return precise_utc(getattr(row, field))

    return column


class AttemptTimesMixin:
    """An attempt's four instants, shown alike on its own page and in its occurrence's list of attempts."""

    started = utc_column("started_at", "started at")
    heartbeat = utc_column("heartbeat_at", "heartbeat at")
    lease_expires = utc_column("lease_expires_at", "lease expires at")
    finished = utc_column("finished_at", "finished at")


class ReadOnlyAdminMixin(SafeActionSelectionMixin):
    """The data plane changes only through its services (materializer, relay, workers): never by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
