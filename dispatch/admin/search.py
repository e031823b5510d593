"""The occurrence list's search box: an id, a schedule's name or labels, or a state reason, each a bounded read of
the partitioned occurrence table.

Every term but an id searches within the list's time range on `scheduled_for`, which the range filter always bounds
when no single schedule is named (dispatch/admin/filters.py ScheduledRangeFilter: the last hour unless told
otherwise; the admin applies the filters before the search). So a search reads at most the day partitions of that
range, never the table:

- an id (a UUID): the occurrence, or one schedule's occurrences over any time from its own index, as before;
- a schedule's name (`payments`, or `name:payments` for a name with an `=` in it), case-insensitive "contains", or
  its labels (`team=payments,env!=dev`, core/labels.py): the schedules are resolved first, at most
  MAX_SEARCHED_SCHEDULES of them, among those of the operator's tenants (and of the tenant filter, if set), then
  their occurrences are read by schedule_id IN (...) within the range. The first step reads the schedule table, not
  the occurrence table: labels through their GIN index, a name as the schedule list's own name search does (no
  index serves "contains"; the LIMIT ends the read once enough match). The second is a bitmap scan of
  occurrence_schedule_recent (schedule_id, scheduled_for) per day partition of the range, or, when the schedules
  found own a good share of the range, the same BRIN scan the plain list does (the planner's choice);
- `reason:<text>`: state reasons containing the text, within the range. No index names state_reason (nor state: a
  change of state must stay a HOT update, docs/DESIGN.md), so this reads the range's rows, as the list's own state
  filter and its newest-first sort do: the BRIN on scheduled_for and partition pruning keep it to the range, and an
  empty reason (the ordinary path's, nearly every row) is rejected before the text is compared.

Measured (EXPLAIN ANALYZE) over 270,000 occurrences of 1,500 schedules, 90,000 in the default hour: the plain list
reads 6,771 buffers; a name matching 122 schedules 1,469 (the schedule index), a label matching 300 schedules and a
reason search the same 6,771 as the plain list (the range's BRIN scan, filtered), each in 5-60 ms.

A scoped operator's search runs on the list's scoped queryset (tenants/access.py), and the schedules it resolves are
scoped too: another tenant's names and labels neither match nor count toward the cap.
"""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from core.labels import SelectorInvalid, parse_selector
from scheduler_project.console import BIGINT_MAX, parse_uuid
from schedules.models import Schedule
from tenants.access import scoped
from tenants.filters import TenantFilter

# Schedules a name or label search may resolve to: their ids go into one IN list, and each costs a range scan of
# its index. More than this is refused with a message (never silently cut: the rows shown would be a random part).
MAX_SEARCHED_SCHEDULES = 1000
REASON_PREFIX = "reason:"
NAME_PREFIX = "name:"
HELP_TEXT = (
    "An occurrence or schedule id (exact UUID, any time); a schedule name (contains) or labels (team=payments,"
    "env!=dev); reason:<text> for the state reason. Names, labels and reasons are searched within the range shown."
)


def search_occurrences(request: HttpRequest, queryset: QuerySet, term: str) -> QuerySet:
    """The occurrences of `queryset` (the list's, already filtered to its range and the operator's tenants) that
    the search term names; an unusable term says why in a message and matches nothing."""
    term = term.strip()
    if not term:
        return queryset
    wanted = parse_uuid(term)
    if wanted is not None:
        return queryset.filter(Q(occurrence_id=wanted) | Q(schedule_id=wanted))
    if term.lower().startswith(REASON_PREFIX):
        text = term[len(REASON_PREFIX) :].strip()
        if not text:
            messages.error(request, f"Give the text to look for after {REASON_PREFIX!r}.")
            return queryset.none()
        return queryset.exclude(state_reason="").filter(state_reason__icontains=text)
    schedules = _schedules_named(request, term)
    if schedules is None:
        return queryset.none()
    ids = list(
        _within_tenant_filter(request, scoped(request, schedules)).values_list("pk", flat=True)[
            : MAX_SEARCHED_SCHEDULES + 1
        ]
    )
    if len(ids) > MAX_SEARCHED_SCHEDULES:
        messages.error(
            request,
            f"More than {MAX_SEARCHED_SCHEDULES:,} schedules match {term[:80]!r}: nothing is listed. Narrow the search "
            "(a longer name, another label) or pick a tenant.",
        )
        return queryset.none()
    if not ids:
        messages.info(request, f"No schedule you can see matches {term[:80]!r}.")
        return queryset.none()
    return queryset.filter(schedule_id__in=ids)


def _schedules_named(request: HttpRequest, term: str) -> QuerySet | None:
    """The schedules a name or label term selects (not yet scoped or bounded), or None with a message."""
    if term.lower().startswith(NAME_PREFIX):
        name = term[len(NAME_PREFIX) :].strip()
        if not name:
            messages.error(request, f"Give the name to look for after {NAME_PREFIX!r}.")
            return None
        return Schedule.objects.filter(name__icontains=name)
    if "=" not in term:
        return Schedule.objects.filter(name__icontains=term)
    try:
        selector = parse_selector(term)
    except SelectorInvalid as exc:
        messages.error(request, f"Not a label selector: {exc} (for a name with '=' in it, search name:<name>)")
        return None
    return Schedule.objects.selected(selector)


def _within_tenant_filter(request: HttpRequest, schedules: QuerySet) -> QuerySet:
    """The tenant filter's tenant only, when one is picked: the schedules are then found through the tenant's own
    index (schedule_tenant_state) instead of among every tenant's."""
    value = request.GET.get(TenantFilter.parameter_name, "")
    if value.isascii() and value.isdigit() and int(value) <= BIGINT_MAX:
        return schedules.filter(tenant_id=int(value))
    return schedules
