"""What the data plane's admin pages share: instants to the millisecond, an attempt's times, the names of an
occurrence's schedule and tenant, counts that say what is shown, and read-only access."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest

from dispatch.models import Occurrence
from scheduler_project.console import SafeActionSelectionMixin
from schedules.models import Schedule
from tenants.models import Tenant


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


@dataclass(frozen=True)
class ScheduleLabel:
    """What a row of occurrences shows of its schedule."""

    name: str
    timezone: str
    state: str


def label_rows(occurrences: Iterable[Occurrence]) -> None:
    """Set `schedule_label` (a ScheduleLabel, None when the schedule is gone) and `tenant_slug` (None when the tenant
    is gone) on each occurrence, in one query for each, over the rows given (a page).

    Not a join of the list's query: a deleted tenant takes its schedules with it and leaves its finished
    occurrences, which an inner join would drop from the rows while the count (and the DLQ tile) still counted
    them. Looked up here, every row counted is shown, and its dead ones can be resolved."""
    rows = list(occurrences)
    schedules = {
        pk: ScheduleLabel(name, timezone, state)
        for pk, name, timezone, state in Schedule.objects.filter(pk__in={o.schedule_id for o in rows}).values_list(
            "pk", "name", "timezone", "state"
        )
    }
    tenants = dict(Tenant.objects.filter(pk__in={o.tenant_id for o in rows}).values_list("pk", "slug"))
    for occurrence in rows:
        occurrence.schedule_label = schedules.get(occurrence.schedule_id)  # type: ignore[attr-defined]
        occurrence.tenant_slug = tenants.get(occurrence.tenant_id)  # type: ignore[attr-defined]


def labels_of(occurrence: Occurrence) -> tuple[ScheduleLabel | None, str | None]:
    """The occurrence's schedule label and tenant slug, looked up now when no page did (its own change page)."""
    if not hasattr(occurrence, "schedule_label"):
        label_rows([occurrence])
    return occurrence.schedule_label, occurrence.tenant_slug  # type: ignore[attr-defined]


class AttemptTimesMixin:
    """An attempt's four instants, shown alike on its own page and in its occurrence's list of attempts."""

    started = utc_column("started_at", "started at")
    heartbeat = utc_column("heartbeat_at", "heartbeat at")
    lease_expires = utc_column("lease_expires_at", "lease expires at")
    finished = utc_column("finished_at", "finished at")


class ShownCountChangeList(ChangeList):
    """A changelist whose count says exactly the rows it shows whenever they are the whole list.

    The admin counts with one statement and reads the rows with another. On these tables rows come and go between
    the two (the materializer writes fires ahead, the relay publishes and settles envelopes at thousands a second),
    and above EXACT_COUNT_LIMIT the count is the planner's, or the table statistics', estimate: "4 occurrences" stood
    above 5 rows, "≈ 150,000" above the 12 envelopes left after a burst. When the rows read are the whole list (it
    fits on one page, or its first page is not full), their number is the count.
    """

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        self.result_list = rows
        whole = (self.show_all and self.can_show_all) or not self.multi_page
        first_page_short = self.page_num == 1 and len(rows) < self.list_per_page
        if not (whole or first_page_short):
            return
        # Paginator.count and num_pages are cached properties: replaced, the page links follow the rows too.
        self.paginator.__dict__["count"] = len(rows)
        self.paginator.__dict__.pop("num_pages", None)
        self.paginator.estimated = False
        self.result_count = len(rows)
        self.multi_page = False
        self.can_show_all = len(rows) <= self.list_max_show_all


class ReadOnlyAdminMixin(SafeActionSelectionMixin):
    """The data plane changes only through its services (materializer, relay, workers): never by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
