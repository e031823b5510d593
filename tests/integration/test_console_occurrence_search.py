"""Finding occurrences in the console (dispatch/admin/search.py): by schedule name, by schedule labels and by state
reason, always within the list's time range; a scoped operator's search never shows another tenant's rows, nor lets
them count toward the cap on schedules; and the columns that sort within a bounded range."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.messages import get_messages

from core.clock import db_now
from dispatch.admin import search
from dispatch.models import Occurrence, OccurrenceState
from tenants.access import READ_ONLY_GROUP
from tests.conftest import occurrence_for, schedule_for
from tests.integration.test_operator_scope import member

OCCURRENCES = "/admin/dispatch/occurrence/"
LATE = "late by 612 s > max lateness 60 s (skip)"
OVERLAP = "overlap: occurrence 5e1f0c3a-0000-4000-8000-000000000000 still running (skip_if_running)"
ROW_ID = re.compile(r'<code title="([0-9a-f-]{36})">')


def shown(client, **query: str) -> list[str]:
    """The ids of the rows a list page shows, in order."""
    response = client.get(OCCURRENCES, query)
    assert response.status_code == 200, response.status_code
    return ROW_ID.findall(response.content.decode())


def said(client, **query: str) -> str:
    return " ".join(str(m) for m in get_messages(client.get(OCCURRENCES, query).wsgi_request))


def fire(schedule, minutes: float, state: str = OccurrenceState.SUCCEEDED, reason: str = "", **fields) -> Occurrence:
    at = db_now().replace(second=0, microsecond=0) - timedelta(minutes=minutes)
    return occurrence_for(schedule, at=at, state=state, state_reason=reason, **fields)


@pytest.fixture
def fleet(tenant_a, tenant_b) -> dict[str, Occurrence]:
    """Fires of labelled schedules in two tenants, in the last hour and three hours back."""
    payments = schedule_for(tenant_a.tenant, name="payments-nightly", labels={"team": "payments", "env": "prod"})
    staging = schedule_for(tenant_a.tenant, name="payments-staging", labels={"team": "payments", "env": "dev"})
    search_job = schedule_for(tenant_a.tenant, name="search-reindex", labels={"team": "search"})
    theirs = schedule_for(tenant_b.tenant, name="payments-globex", labels={"team": "payments", "env": "prod"})
    return {
        "payments": fire(payments, 10, OccurrenceState.MISSED, LATE),
        "payments_old": fire(payments, 180),
        "staging": fire(staging, 12),
        "search": fire(search_job, 14, OccurrenceState.SKIPPED_OVERLAP, OVERLAP),
        "theirs": fire(theirs, 16, OccurrenceState.MISSED, LATE),
    }


def ids(fleet: dict[str, Occurrence], *names: str) -> set[str]:
    return {str(fleet[name].pk) for name in names}


def test_a_schedule_name_finds_its_fires_within_the_range_shown(console, fleet):
    assert set(shown(console, q="payments")) == ids(fleet, "payments", "staging", "theirs")
    assert set(shown(console, q="PAYMENTS-NIGHTLY")) == ids(fleet, "payments"), "case-insensitive, the last hour"
    wider = shown(console, q="payments-nightly", scheduled_after="now-24h")
    assert wider == [str(fleet["payments"].pk), str(fleet["payments_old"].pk)], "newest first, over the wider range"
    assert shown(console, q="no-such-job") == []
    assert "No schedule you can see matches 'no-such-job'." in said(console, q="no-such-job")


def test_labels_select_the_schedules_whose_fires_are_listed(console, fleet):
    assert set(shown(console, q="team=payments")) == ids(fleet, "payments", "staging", "theirs")
    assert set(shown(console, q="team=payments,env!=prod")) == ids(fleet, "staging")
    assert set(shown(console, q="name:search-reindex")) == ids(fleet, "search")
    assert shown(console, q="Team=payments") == []
    assert "Not a label selector" in said(console, q="Team=payments")


def test_a_state_reason_is_searched_within_the_range(console, fleet, tenant_a):
    assert set(shown(console, q="reason:late by")) == ids(fleet, "payments", "theirs")
    assert set(shown(console, q="reason:SKIP_IF_RUNNING")) == ids(fleet, "search")
    old = fire(schedule_for(tenant_a.tenant, name="older"), 300, OccurrenceState.MISSED, LATE)
    assert str(old.pk) not in shown(console, q="reason:late by"), "five hours back: outside the last hour"
    assert str(old.pk) in shown(console, q="reason:late by", scheduled_after="now-24h")
    assert "Give the text to look for" in said(console, q="reason:")


def test_a_scoped_operators_search_never_shows_another_tenants_rows(fleet, tenant_a):
    reader = member("rita", READ_ONLY_GROUP, [tenant_a.tenant])

    for query in ("payments", "team=payments", "reason:late by", "payments-globex"):
        assert ids(fleet, "theirs").isdisjoint(shown(reader, q=query, scheduled_after="now-24h")), query
    assert set(shown(reader, q="team=payments,env=prod")) == ids(fleet, "payments")
    assert "No schedule you can see matches 'payments-globex'." in said(reader, q="payments-globex")


def test_too_many_schedules_are_refused_counting_only_the_operators_own(console, fleet, tenant_a, monkeypatch):
    """The cap is on the schedules resolved, after the operator's scope: another tenant's names never use it up."""
    monkeypatch.setattr(search, "MAX_SEARCHED_SCHEDULES", 2)
    reader = member("rita", READ_ONLY_GROUP, [tenant_a.tenant])

    assert shown(console, q="team=payments") == [], "three schedules match, two may be resolved"
    assert "More than 2 schedules match 'team=payments': nothing is listed." in said(console, q="team=payments")
    assert set(shown(reader, q="team=payments")) == ids(fleet, "payments", "staging")
    assert set(shown(console, q="team=payments", tenant__id__exact=str(tenant_a.tenant.pk))) == ids(
        fleet, "payments", "staging"
    ), "a tenant picked narrows the schedules resolved"


def test_state_sorts_within_a_bounded_range_and_only_the_fire_time_over_any_time(console, fleet):
    state_column = "o=6"  # action checkbox, occurrence, tenant, schedule, version, scheduled for, state
    page = unescape(console.get(OCCURRENCES).content.decode())
    assert state_column in page, "the state header sorts"

    by_state = shown(console, o="6")
    states = [Occurrence.objects.get(pk=pk).state for pk in by_state]
    assert states == sorted(states) and len(states) == 4
    assert by_state[-2:] == [str(fleet["search"].pk), str(fleet["staging"].pk)], "skipped, then succeeded"

    schedule = fleet["payments"].schedule_id
    over_any_time = unescape(console.get(OCCURRENCES, {"schedule": str(schedule)}).content.decode())
    assert state_column not in over_any_time and "o=5" in over_any_time, "only the fire time sorts there"
    assert shown(console, schedule=str(schedule), o="6") == [str(fleet["payments"].pk), str(fleet["payments_old"].pk)]
    assert shown(console, schedule=str(schedule), o="-6") == shown(console, schedule=str(schedule))
