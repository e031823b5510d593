"""What the data plane's admin pages share: instants to the millisecond, and read-only access."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest

from scheduler_project.console import SafeActionSelectionMixin


def precise_utc(value: datetime | None) -> str:
    """Milliseconds matter here: enqueue lag is judged against a 5-second budget."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


class ReadOnlyAdminMixin(SafeActionSelectionMixin):
    """The data plane changes only through its services (materializer, relay, workers): never by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
