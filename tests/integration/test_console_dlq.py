"""The dead-letter queue in the console: every dashboard tile counts the rows of the list it opens, a dead fire can be
resolved (with a note, recorded, undone by a replay), bulk replay and resolve show what they will do before doing
it, and a list's count says the rows it shows."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client

from core.clock import db_now
from dispatch.identity import occurrence_id_for
from dispatch.models import Attempt, Occurrence, OccurrenceResolution, OccurrenceState, OutboxMessage
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE
from schedules.services import cancel_schedule
from tenants.access import OPERATOR_GROUP, READ_ONLY_GROUP
from tests.conftest import occurrence_for, schedule_for
from tests.integration.test_operator_scope import member

OCCURRENCES = "/admin/dispatch/occurrence/"
OUTBOX = "/admin/dispatch/outboxmessage/"
TILE = re.compile(r'<a class="tile[^"]*" href="([^"]+)">\s*<span class="figure">(\d+)\+?</span>')
PAGINATOR = re.compile(r"(?:≈ )?(\d+) (?:occurrences?|outbox messages?)(?: \(estimated\))?\s*</p>")


def html(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def texts(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def tiles(client: Client) -> dict[str, int]:
    """The dashboard's tiles: the list each links to, and its figure."""
    return {unescape(href): int(figure) for href, figure in TILE.findall(html(client.get("/admin/")))}


def listed(client: Client, url: str) -> tuple[int, int]:
    """(the count a list states, the rows it shows)."""
    page = html(client.get(url))
    stated = PAGINATOR.search(page)
    assert stated, url
    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in page else ""
    return int(stated.group(1)), body.count("<tr")


def dead(schedule, minutes_ago: float, **fields) -> Occurrence:
    at = db_now().replace(microsecond=0) - timedelta(minutes=minutes_ago)
    return occurrence_for(schedule, at=at, state=OccurrenceState.DEAD, finished_at=at, **fields)


def pks(*occurrences: Occurrence) -> list[str]:
    return [str(o.pk) for o in occurrences]


@pytest.fixture
def console_rows(tenant_a, tenant_b):
    """Dead fires in and far outside the list's default hour, in two tenants; stuck fires; envelopes due, ahead and
    published. Returns acme's schedule."""
    now = db_now().replace(microsecond=0)
    acme = schedule_for(tenant_a.tenant, name="acme-report")
    globex = schedule_for(tenant_b.tenant, name="globex-report")
    for minutes_ago in (5, 20, 3 * 60, 3 * 24 * 60):
        dead(acme, minutes_ago)
    dead(globex, 10)
    occurrence_for(acme, at=now - timedelta(minutes=30), state=OccurrenceState.ENQUEUED)
    occurrence_for(globex, at=now - timedelta(hours=2), state=OccurrenceState.SCHEDULED)
    due_at, ahead = now - timedelta(minutes=1), now + timedelta(minutes=10)
    with connection.cursor() as cursor:
        for at, fires in (
            (due_at, 2),
            (due_at - timedelta(seconds=5), 1),
            (ahead, 1),
            (ahead + timedelta(minutes=1), 1),
        ):
            enqueue(
                cursor,
                [
                    Fire(
                        occurrence_id_for(acme.id, 7, at + timedelta(seconds=n)),
                        at,
                        acme.tenant_id,
                        STRICT_QUEUE,
                        at,
                        0,
                    )
                    for n in range(fires)
                ],
            )
    OutboxMessage.objects.filter(available_at=ahead + timedelta(minutes=1)).update(published_at=now)
    return acme


@pytest.mark.parametrize("who", ["platform", "acme operator"])
def test_every_dashboard_tile_counts_exactly_the_rows_of_the_list_it_opens(console, console_rows, tenant_a, who):
    client = console if who == "platform" else member("ana", READ_ONLY_GROUP, [tenant_a.tenant])

    shown = tiles(client)

    expected = {
        "platform": {
            f"{OCCURRENCES}?dlq=1": 5,  # every dead fire, however old: 4 of acme, 1 of globex
            f"{OCCURRENCES}?state__exact=missed&scheduled_after=now-1h": 0,  # tests/integration/test_console_health.py
            f"{OCCURRENCES}?stuck=1&scheduled_after=now-24h": 2,
            f"{OUTBOX}?status=due": 2,  # envelopes (of 3 fires)
            f"{OUTBOX}?status=published": 1,
        },
        "acme operator": {
            f"{OCCURRENCES}?dlq=1": 4,
            f"{OCCURRENCES}?state__exact=missed&scheduled_after=now-1h": 0,
            f"{OCCURRENCES}?stuck=1&scheduled_after=now-24h": 1,
        },
    }[who]
    for url, figure in shown.items():
        assert listed(client, url) == (figure, figure), url
    assert shown == expected


def test_a_resolved_fire_leaves_the_tile_and_the_dlq_list_and_is_listed_apart(console, console_rows):
    first, *_ = Occurrence.objects.filter(schedule=console_rows, state=OccurrenceState.DEAD).order_by("scheduled_for")

    response = console.post(f"{OCCURRENCES}{first.pk}/resolve/", {"note": "re-sent by hand"}, follow=True)

    assert "left the dead-letter queue" in " ".join(texts(response))
    assert tiles(console)[f"{OCCURRENCES}?dlq=1"] == 4 == listed(console, f"{OCCURRENCES}?dlq=1")[0]
    assert str(first.pk) not in html(console.get(f"{OCCURRENCES}?dlq=1"))
    resolved = html(console.get(f"{OCCURRENCES}?dlq=resolved"))
    assert str(first.pk) in resolved and "resolved by operator:ops" in resolved
    assert listed(console, f"{OCCURRENCES}?dlq=resolved") == (1, 1)


# --- resolve, and replay after it ----------------------------------------------------------------------------------


def test_resolve_records_who_when_and_why_keeps_the_history_and_a_replay_undoes_it(console, tenant_a, operator):
    schedule = schedule_for(tenant_a.tenant, name="resolve-me")
    occurrence = dead(schedule, 15, attempt_count=2, state_reason="attempts exhausted (2 of 2)")
    for generation in (1, 2):
        Attempt.objects.create(
            occurrence_id=occurrence.pk,
            scheduled_for=occurrence.scheduled_for,
            generation=generation,
            worker="w-1",
            started_at=occurrence.scheduled_for + timedelta(seconds=generation),
            finished_at=occurrence.scheduled_for + timedelta(seconds=generation, milliseconds=300),
            outcome="failed",
            error_class="transient",
            error="TransientError: 503",
        )
    page_url, resolve_url = f"{OCCURRENCES}{occurrence.pk}/change/", f"{OCCURRENCES}{occurrence.pk}/resolve/"
    assert resolve_url in html(console.get(page_url))
    form = html(console.get(resolve_url))
    assert 'name="note"' in form and "It leaves the dead-letter queue" in form
    refused = html(console.post(resolve_url, {"note": "   "}))
    assert "This field is required." in refused and not OccurrenceResolution.objects.exists()

    before = db_now()
    console.post(resolve_url, {"note": "customer re-sent the invoice by hand"})

    resolution = OccurrenceResolution.objects.get(occurrence_id=occurrence.pk)
    assert (resolution.resolved_by, resolution.note, resolution.attempt_count) == (
        "operator:ops",
        "customer re-sent the invoice by hand",
        2,
    )
    assert before <= resolution.resolved_at <= db_now()
    occurrence.refresh_from_db()
    assert occurrence.state == OccurrenceState.DEAD, "resolving changes no state"
    assert Attempt.objects.filter(occurrence_id=occurrence.pk).count() == 2, "the attempts are kept"
    assert LogEntry.objects.get(user=operator, object_id=str(occurrence.pk)).change_message == (
        "Resolved (out of the dead-letter queue): customer re-sent the invoice by hand"
    )
    page = html(console.get(page_url))
    assert "Resolved by operator:ops" in page and "customer re-sent the invoice by hand" in page
    assert "resolved by operator:ops" in page, "the verdict at the top says it too"
    assert resolve_url not in page and f"{OCCURRENCES}{occurrence.pk}/replay/" in page
    again = console.post(resolve_url, {"note": "twice"}, follow=True)
    assert any("already resolved by operator:ops" in text for text in texts(again))

    console.post(f"{OCCURRENCES}{occurrence.pk}/replay/")

    occurrence.refresh_from_db()
    assert (occurrence.pk, occurrence.state, occurrence.forced) == (resolution.occurrence_id, "scheduled", True)
    page = html(console.get(page_url))
    assert "A replay ran it again since." in page, "the resolution stays in the timeline as history"
    # The replay dies again (its third attempt): it is in the dead-letter queue again, resolvable again.
    Occurrence.objects.filter(pk=occurrence.pk).update(state=OccurrenceState.DEAD, attempt_count=3)
    assert str(occurrence.pk) in html(console.get(f"{OCCURRENCES}?dlq=1"))
    assert tiles(console)[f"{OCCURRENCES}?dlq=1"] == 1
    assert resolve_url in html(console.get(page_url))


def test_a_dead_fire_of_a_canceled_schedule_cannot_be_replayed_but_is_resolved(console, tenant_a):
    schedule = schedule_for(tenant_a.tenant, name="gone-for-good")
    occurrence = dead(schedule, 30)
    cancel_schedule(schedule, actor="test")
    assert tiles(console)[f"{OCCURRENCES}?dlq=1"] == 1

    replayed = console.post(f"{OCCURRENCES}{occurrence.pk}/replay/", follow=True)
    console.post(f"{OCCURRENCES}{occurrence.pk}/resolve/", {"note": "schedule retired"})

    assert any("Not replayed" in text and "canceled" in text for text in texts(replayed))
    assert tiles(console)[f"{OCCURRENCES}?dlq=1"] == 0
    assert listed(console, f"{OCCURRENCES}?dlq=1") == (0, 0)


# --- bulk actions ask first ----------------------------------------------------------------------------------------


def test_bulk_replay_lists_what_it_will_replay_and_replays_only_once_confirmed(console, tenant_a):
    schedule = schedule_for(tenant_a.tenant, name="bulk-replay")
    first, second = dead(schedule, 3), dead(schedule, 4)
    fine = occurrence_for(schedule, at=db_now() - timedelta(minutes=5), state=OccurrenceState.SUCCEEDED)
    chosen = {"action": "replay_dead", ACTION_CHECKBOX_NAME: pks(first, second, fine)}

    page = html(console.post(OCCURRENCES, chosen))

    assert "Replay 2 of these 3 occurrences?" in page
    assert all(pk in page for pk in pks(first, second, fine))
    assert "refused: succeeded: only a dead occurrence can be replayed" in page
    assert 'value="Confirm: replay 2"' in page and 'name="confirm" value="yes"' in page
    assert set(Occurrence.objects.filter(schedule=schedule).values_list("state", flat=True)) == {"dead", "succeeded"}
    assert not LogEntry.objects.exists(), "nothing done, nothing logged"

    done = console.post(OCCURRENCES, {**chosen, "confirm": "yes"}, follow=True)

    assert "Replayed 2 dead occurrence(s) under their own ids." in texts(done)
    assert Occurrence.objects.get(pk=first.pk).state == Occurrence.objects.get(pk=second.pk).state == "scheduled"


def test_bulk_resolve_takes_its_note_on_the_confirmation_page(console, tenant_a):
    schedule = schedule_for(tenant_a.tenant, name="bulk-resolve")
    first, second = dead(schedule, 3), dead(schedule, 4)
    console.post(f"{OCCURRENCES}{second.pk}/resolve/", {"note": "earlier"})
    chosen = {"action": "resolve_dead", ACTION_CHECKBOX_NAME: pks(first, second)}

    page = html(console.post(OCCURRENCES, chosen))
    assert "Resolve 1 of these 2 occurrences?" in page and 'name="note"' in page
    assert "refused: already resolved by operator:ops" in page
    assert 'value="Confirm: resolve 1"' in page
    no_note = html(console.post(OCCURRENCES, {**chosen, "confirm": "yes", "note": ""}))
    assert "This field is required." in no_note
    assert OccurrenceResolution.objects.count() == 1, "neither the first POST nor one without a note resolved"

    done = console.post(OCCURRENCES, {**chosen, "confirm": "yes", "note": "load test fallout"}, follow=True)

    assert "Resolved 1 dead occurrence(s): they left the dead-letter queue." in texts(done)
    assert any("Not resolved: 1." in text and "already resolved" in text for text in texts(done))
    assert OccurrenceResolution.objects.get(occurrence_id=first.pk).note == "load test fallout"


# --- who may ------------------------------------------------------------------------------------------------------


def test_an_operator_resolves_only_its_tenants_fires_and_a_read_only_one_is_offered_no_action(tenant_a, tenant_b):
    own = dead(schedule_for(tenant_a.tenant, name="own"), 5)
    other = dead(schedule_for(tenant_b.tenant, name="other"), 5)
    operator = member("ana", OPERATOR_GROUP, [tenant_a.tenant])
    reader = member("rita", READ_ONLY_GROUP, [tenant_a.tenant])

    operator.post(
        f"{OCCURRENCES}?dlq=1",
        {"action": "resolve_dead", ACTION_CHECKBOX_NAME: pks(own, other), "confirm": "yes", "note": "mine"},
    )
    assert operator.post(f"{OCCURRENCES}{other.pk}/resolve/", {"note": "not mine"}).status_code == 302

    assert list(OccurrenceResolution.objects.values_list("occurrence_id", flat=True)) == [own.pk]
    listing = html(reader.get(f"{OCCURRENCES}?dlq=resolved"))
    assert str(own.pk) in listing and 'value="resolve_dead"' not in listing and 'value="replay_dead"' not in listing
    assert f"{OCCURRENCES}{own.pk}/resolve/" not in html(reader.get(f"{OCCURRENCES}{own.pk}/change/"))
    assert reader.post(f"{OCCURRENCES}{own.pk}/resolve/", {"note": "x"}).status_code == 403
    assert 'value="resolve_dead"' in html(operator.get(f"{OCCURRENCES}?dlq=1"))


# --- a count that says what is shown ------------------------------------------------------------------------------


def test_a_fire_whose_tenant_was_deleted_is_listed_counted_and_resolvable(console, tenant_a):
    """A deleted tenant takes its schedules and leaves its dead fires: the list's join dropped them from the rows
    (4 rows under "5 occurrences") while the DLQ tile still counted them, with no way to clear them."""
    schedule = schedule_for(tenant_a.tenant, name="kept")
    kept = [dead(schedule, minutes) for minutes in (1, 2, 3, 4)]
    at = db_now().replace(microsecond=0) - timedelta(minutes=6)
    orphan = Occurrence.objects.create(
        occurrence_id=uuid.uuid4(),
        schedule_id=uuid.uuid4(),
        tenant_id=987654,
        schedule_version=1,
        scheduled_for=at,
        available_at=at,
        lane="strict",
        state=OccurrenceState.DEAD,
    )

    for url in (OCCURRENCES, f"{OCCURRENCES}?dlq=1"):
        assert listed(console, url) == (5, 5), url
    page = html(console.get(f"{OCCURRENCES}?dlq=1"))
    assert "987654 (deleted)" in page and f"<code>{orphan.schedule_id}</code> (deleted)" in page
    assert "(deleted)" in html(console.get(f"{OCCURRENCES}{orphan.pk}/change/"))
    replay = html(console.post(OCCURRENCES, {"action": "replay_dead", ACTION_CHECKBOX_NAME: pks(orphan)}))
    assert "refused: its schedule is gone (its tenant was deleted)" in replay
    refused = console.post(f"{OCCURRENCES}{orphan.pk}/replay/", follow=True)
    assert any("no longer exists" in text for text in texts(refused)), "no worker could ever claim it"
    console.post(
        OCCURRENCES, {"action": "resolve_dead", ACTION_CHECKBOX_NAME: pks(orphan), "confirm": "yes", "note": "gone"}
    )
    assert tiles(console)[f"{OCCURRENCES}?dlq=1"] == len(kept)


def test_a_row_written_between_the_count_and_the_read_is_counted_with_the_rows(console, tenant_a):
    """The count and the rows are two statements; the materializer writes fires ahead between them."""
    schedule = schedule_for(tenant_a.tenant, name="busy")
    now = db_now().replace(microsecond=0)
    for minutes in (1, 2, 3, 4):
        occurrence_for(schedule, at=now - timedelta(minutes=minutes))
    written: list[Occurrence] = []

    def materialize_after_the_count(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not written and "COUNT(" in sql and "dispatch_occurrence" in sql:
            written.append(occurrence_for(schedule, at=now + timedelta(minutes=1)))
        return result

    with connection.execute_wrapper(materialize_after_the_count):
        stated, rows = listed(console, OCCURRENCES)

    assert written, "the list counted"
    assert (stated, rows) == (5, 5)


def test_an_estimate_left_high_by_a_burst_gives_way_to_the_rows_shown(console, tenant_a, monkeypatch):
    """Unfiltered, the outbox list takes the table statistics for its total; after a burst they may say 150,000
    where a dozen envelopes are left."""
    schedule = schedule_for(tenant_a.tenant, name="after-burst")
    at = db_now().replace(microsecond=0)
    with connection.cursor() as cursor:
        for n in range(3):
            fire_at = at + timedelta(minutes=n)
            enqueue(
                cursor,
                [
                    Fire(
                        occurrence_id_for(schedule.id, 1, fire_at),
                        fire_at,
                        schedule.tenant_id,
                        STRICT_QUEUE,
                        fire_at,
                        0,
                    )
                ],
            )
    monkeypatch.setattr("scheduler_project.console.estimated_table_rows", lambda queryset: 150_000)

    page = html(console.get(OUTBOX))

    assert listed(console, OUTBOX) == (3, 3)
    assert "(estimated)" not in page
