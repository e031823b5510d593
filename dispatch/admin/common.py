"""What the data plane's admin pages share: instants to the millisecond, an attempt's times, and read-only access."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from dispatch.models import Attempt
from scheduler_project.console import SafeActionSelectionMixin


def precise_utc(value: datetime | None) -> str:
    """Milliseconds matter here: enqueue lag is judged against a 5-second budget."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


class AttemptTimesMixin:
    """An attempt's four instants, shown alike on its own page and in its occurrence's list of attempts."""

    @admin.display(description="started at")
    def started(self, attempt: Attempt) -> str:
        return precise_utc(attempt.started_at)

    @admin.display(description="heartbeat at")
    def heartbeat(self, attempt: Attempt) -> str:
        return precise_utc(attempt.heartbeat_at)

    @admin.display(description="lease expires at")
    def lease_expires(self, attempt: Attempt) -> str:
        return precise_utc(attempt.lease_expires_at)

    @admin.display(description="finished at")
    def finished(self, attempt: Attempt) -> str:
        return precise_utc(attempt.finished_at)


class ReadOnlyAdminMixin(SafeActionSelectionMixin):
    """The data plane changes only through its services (materializer, relay, workers): never by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
