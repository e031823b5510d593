"""The console tells the truth at a glance: a stall shows as a banner in words on every page, the same judgement
/healthz answers; fires recorded missed have a tile that counts exactly the list it opens; and a missed fire's
timeline says what was down when it fell due, when the heartbeat rows tell."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.db import connection
from django.test import Client

from core.clock import db_now
from dispatch import dashboard
from dispatch.identity import occurrence_id_for
from dispatch.models import OccurrenceState, OutboxMessage, ProcessHeartbeat
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE
from scheduler_project import health
from tenants.access import READ_ONLY_GROUP
from tests.conftest import occurrence_for, schedule_for
from tests.integration.test_console_dlq import OCCURRENCES, listed, tiles
from tests.integration.test_operator_scope import member

MISSED_TILE = f"{OCCURRENCES}?state__exact=missed&scheduled_after=now-1h"
BANNER = re.compile(r'<div id="console-health" class="console-health health-(\w+)".*?</div>', re.S)


@pytest.fixture(autouse=True)
def _fresh_assessment():
    """Each test judges its own platform: no assessment remembered from another test's page views."""
    health.forget()
    yield
    health.forget()


def banner(client: Client, url: str) -> tuple[str, list[str]] | None:
    """The health banner of a page: its status and its lines, or None when the page shows none."""
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    found = BANNER.search(response.content.decode())
    if found is None:
        return None
    problems = found.group(0).split('class="health-problems"', 1)
    lines = re.findall(r"<li>(.*?)</li>", problems[1].split("</ul>", 1)[0]) if len(problems) > 1 else []
    return found.group(1), [unescape(line) for line in lines]


def processes(**ages: float) -> None:
    """One heartbeat row per role, written `age` seconds ago on PostgreSQL's clock (and nothing else)."""
    ProcessHeartbeat.objects.all().delete()
    now = db_now()
    for role, age in ages.items():
        at = now - timedelta(seconds=age)
        ProcessHeartbeat.objects.create(
            name=f"{role}-1", role=role, started_at=at - timedelta(hours=1), heartbeat_at=at
        )


def test_a_stalled_materializer_is_a_banner_in_words_on_every_page_as_healthz_says(console):
    processes(materializer=123, relay=1)

    status, lines = banner(console, "/admin/")
    answer = Client(HTTP_HOST="localhost").get("/healthz").json()

    assert status == answer["status"] == "degraded"
    assert lines == ["No materializer has reported for 2 min: fires are not being planned."]
    assert answer["reasons"] == ["no materializer wrote a heartbeat in the last 30 s"], "its words are kept"
    health.forget()
    assert banner(console, OCCURRENCES) == ("degraded", lines), "every console page, not only the dashboard"

    processes(materializer=1, relay=1)
    health.forget()
    assert banner(console, OCCURRENCES) is None, "a page other than the dashboard is quiet while all is well"
    assert banner(console, "/admin/") == ("ok", []), "the dashboard says so"
    assert "Healthy: every process reports and fires go out on time." in console.get("/admin/").content.decode()


def test_an_operator_scoped_to_tenants_gets_the_headline_without_the_platforms_details(tenant_a):
    processes(materializer=123, relay=1)
    scoped = member("scoped-health", READ_ONLY_GROUP, [tenant_a.tenant])

    page = scoped.get("/admin/dispatch/occurrence/").content.decode()

    status, lines = banner(scoped, "/admin/dispatch/occurrence/")
    assert status == "degraded" and lines == []
    assert "materializer" not in BANNER.search(page).group(0), "no process of the platform is named"
    assert "The reasons are shown to the platform's operators" in page


def test_a_relay_without_any_row_and_a_backlog_are_named(console, tenant_a):
    processes(materializer=1)
    schedule = schedule_for(tenant_a.tenant, name="backlog")
    due = db_now() - timedelta(seconds=95)
    with connection.cursor() as cursor:
        for at, throttled in ((due, False), (due - timedelta(minutes=30), True)):
            enqueue(cursor, [Fire(occurrence_id_for(schedule.id, 1, at), at, schedule.tenant_id, STRICT_QUEUE, at, 0)])
            OutboxMessage.objects.filter(available_at=at).update(throttled=throttled)

    status, lines = banner(console, "/admin/")
    answer = Client(HTTP_HOST="localhost").get("/healthz").json()

    assert status == answer["status"] == "degraded"
    assert (
        lines[0]
        == "Relay down. No relay is running (none has a heartbeat on record): fires due are not being published."
    )
    # The envelope held back by its tenant's own fire rate (throttled) is not the platform's backlog.
    assert re.fullmatch(r"Outbox backlog: the oldest due envelope has waited 9[5-9] s to be published .*", lines[1])
    assert re.fullmatch(
        r"the oldest due envelope has waited 9[5-9] s to be published \(limit 60 s\)", answer["reasons"][1]
    )
    assert len(lines) == len(answer["reasons"]) == 2


def test_nobody_signed_out_sees_the_banner(db):
    processes(relay=1)
    page = Client(HTTP_HOST="localhost").get("/admin/login/").content.decode()
    assert "console-health" not in page


# --- the missed tile ------------------------------------------------------------------------------------------------


@pytest.fixture
def missed_rows(tenant_a, tenant_b):
    """Fires recorded missed in the last hour (2 of acme, 1 of globex) and before it (1), and one that ran."""
    now = db_now().replace(microsecond=0)
    acme = schedule_for(tenant_a.tenant, name="acme-missed")
    globex = schedule_for(tenant_b.tenant, name="globex-missed")
    for schedule, minutes_ago in ((acme, 10), (acme, 50), (acme, 120), (globex, 20)):
        at = now - timedelta(minutes=minutes_ago)
        occurrence_for(schedule, at=at, state=OccurrenceState.MISSED, finished_at=at + timedelta(minutes=2))
    occurrence_for(acme, at=now - timedelta(minutes=5), state=OccurrenceState.SUCCEEDED)


@pytest.mark.parametrize(("who", "expected"), [("platform", 3), ("acme operator", 2)])
def test_the_missed_tile_counts_exactly_the_rows_of_the_list_it_opens(console, missed_rows, tenant_a, who, expected):
    client = console if who == "platform" else member("mia", READ_ONLY_GROUP, [tenant_a.tenant])

    shown = tiles(client)

    assert shown[MISSED_TILE] == expected
    assert listed(client, MISSED_TILE) == (expected, expected)


def test_a_sampled_hour_says_its_missed_figure_is_an_estimate(console, missed_rows, monkeypatch):
    monkeypatch.setattr(dashboard, "_percent_for", lambda estimate: 50.0)

    page = console.get("/admin/").content.decode()

    assert dashboard.build().missed_estimated
    assert re.search(r'<span class="figure">≈ \d+</span>\s*<span class="label">missed \([^)]*estimated', page)


# --- what was down when a fire was missed ---------------------------------------------------------------------------


@pytest.fixture
def missed_while_down(tenant_a):
    """A fire the materializer recorded missed on its return: the last one stopped reporting 100 s before the fire
    time, the next started 300 s after it and judged the fire 2 s later."""
    schedule = schedule_for(tenant_a.tenant, name="planned-late")
    due = db_now().replace(microsecond=0) - timedelta(minutes=20)
    judged = due + timedelta(seconds=302)
    occurrence = occurrence_for(
        schedule,
        at=due,
        state=OccurrenceState.MISSED,
        state_reason="late by 302 s > max lateness 60 s (skip)",
        created_at=judged,
        finished_at=judged,
    )
    ProcessHeartbeat.objects.all().delete()
    ProcessHeartbeat.objects.create(
        name="materializer-old",
        role="materializer",
        started_at=due - timedelta(hours=2),
        heartbeat_at=due - timedelta(seconds=100),
    )
    ProcessHeartbeat.objects.create(
        name="materializer-new", role="materializer", started_at=due + timedelta(seconds=300), heartbeat_at=db_now()
    )
    return occurrence


def timeline_of(client: Client, occurrence) -> str:
    page = client.get(f"{OCCURRENCES}{occurrence.pk}/change/").content.decode()
    return unescape(re.sub(r"\s+", " ", page.split('id="occurrence-timeline"', 1)[1].split("</table>", 1)[0]))


def test_a_missed_fires_timeline_says_no_materializer_had_reported(console, missed_while_down):
    timeline = timeline_of(console, missed_while_down)

    assert "No materializer heartbeat on record" in timeline
    assert (
        "No materializer heartbeat on record covers the 400 s until materializer-new started, 300.000 s after its "
        "release: if none was running, fires were not planned meanwhile." in timeline
    )
    assert "(materializer-old)" in timeline


def test_a_missed_fires_timeline_says_nothing_of_outages_the_rows_do_not_tell(console, missed_while_down):
    # The old materializer's row is gone (it stopped cleanly, or was pruned): when the silence began is not known.
    ProcessHeartbeat.objects.filter(name="materializer-old").delete()
    assert "heartbeat on record" not in timeline_of(console, missed_while_down)

    # One was reporting when the fire fell due: whatever made it late, it was not a silent materializer.
    ProcessHeartbeat.objects.create(
        name="materializer-busy",
        role="materializer",
        started_at=missed_while_down.scheduled_for - timedelta(hours=1),
        heartbeat_at=db_now(),
    )
    ProcessHeartbeat.objects.create(
        name="materializer-old",
        role="materializer",
        started_at=missed_while_down.scheduled_for - timedelta(hours=2),
        heartbeat_at=missed_while_down.scheduled_for - timedelta(seconds=100),
    )
    assert "heartbeat on record" not in timeline_of(console, missed_while_down)
