"""The cron calendar extensions (day-of-month L and NW, day-of-week D#N and DL) through the API and the materializer:
accepted, previewed, described, and materialized on exactly the previewed instants (docs/API.md, "The time model")."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from core.dst import dst_notes
from core.timerules import TimeRule
from schedules.cron_text import describe_cron
from tests.integration.support import materialize_as_previewed
from tests.integration.test_api_schedules import SCHEDULES

YEAR_START, YEAR_END = datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)


def z(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# Materialized and never run by a worker, every row would be stuck: these tests are about gaps.
pytestmark = pytest.mark.usefixtures("gaps_only")


def preview(api, body: dict, *, after: datetime, count: int) -> list[datetime]:
    response = api.post(f"{SCHEDULES}preview/", {**body, "after": after.isoformat(), "count": count}, format="json")
    assert response.status_code == 200, response.content
    return [datetime.fromisoformat(fire["at"]) for fire in response.json()["fires"]]


def body(cron: str, zone: str = "America/New_York", name: str = "extension") -> dict:
    return {"name": name, "kind": "cron", "cron": cron, "timezone": zone, "handler": "noop"}


@pytest.mark.parametrize(
    ("cron", "zone", "expected"),
    [
        # The last day of the month at 09:00 New York: EST in winter, EDT from 8 March.
        ("0 9 L * *", "America/New_York", [z(2026, 1, 31, 14), z(2026, 2, 28, 14), z(2026, 3, 31, 13)]),
        # The weekday nearest the 15th: Sunday 15 February and 15 March move to Monday the 16th.
        ("0 9 15W * *", "UTC", [z(2026, 1, 15, 9), z(2026, 2, 16, 9), z(2026, 3, 16, 9)]),
        # Day 1 on a Saturday (August 2026) moves forward to Monday the 3rd, never back into July.
        ("0 9 1W 8 *", "UTC", [z(2026, 8, 3, 9), z(2027, 8, 2, 9), z(2028, 8, 1, 9)]),
        # The second Friday, Madrid (CET, then CEST from 29 March).
        ("0 9 * * fri#2", "Europe/Madrid", [z(2026, 1, 9, 8), z(2026, 2, 13, 8), z(2026, 3, 13, 8), z(2026, 4, 10, 7)]),
        # The last Friday.
        ("0 18 * * 5L", "UTC", [z(2026, 1, 30, 18), z(2026, 2, 27, 18), z(2026, 3, 27, 18)]),
        # A fifth Monday exists only in some months.
        ("0 0 * * 1#5", "UTC", [z(2026, 3, 30), z(2026, 6, 29), z(2026, 8, 31)]),
        # Beside plain values, and under the Vixie rule: the 1st, the last day, or any last Friday.
        ("0 0 1,L * 5L", "UTC", [z(2026, 1, 1), z(2026, 1, 30), z(2026, 1, 31), z(2026, 2, 1)]),
    ],
)
def test_an_extension_is_accepted_and_previewed_on_the_days_it_names(api_a, cron, zone, expected):
    created = api_a.post(SCHEDULES, body(cron, zone), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["cron"] == cron  # written as stored: L and W in capitals, names in lowercase

    assert preview(api_a, body(cron, zone), after=YEAR_START - timedelta(seconds=1), count=len(expected)) == expected
    response = api_a.get(f"{SCHEDULES}{created.json()['id']}/preview/", {"after": "2025-12-31T23:59:59Z", "count": 3})
    assert [datetime.fromisoformat(fire["at"]) for fire in response.json()["fires"]] == expected[:3]


@pytest.mark.parametrize(
    ("written", "stored"),
    [("0 18 * * 5l", "0 18 * * 5L"), ("0 9 15w * *", "0 9 15W * *"), ("0 0 1,l * FRIl", "0 0 1,L * friL")],
)
def test_the_stored_expression_spells_l_and_w_in_capitals_so_5l_never_reads_as_51(api_a, written, stored):
    created = api_a.post(SCHEDULES, body(written), format="json")

    assert created.status_code == 201, created.content
    assert created.json()["cron"] == stored


@pytest.mark.parametrize(
    ("cron", "words"),
    [
        ("0 9 L * *", "At 09:00 on the last day of the month"),
        ("0 9 15W * *", "At 09:00 on the weekday nearest day 15 of the month"),
        ("0 9 * * fri#2", "At 09:00 on the second Friday of the month"),
        ("0 9 * * 5L", "At 09:00 on the last Friday of the month"),
    ],
)
def test_the_console_describes_an_extension_in_words(cron, words):
    assert describe_cron(cron) == words


@pytest.mark.parametrize(
    ("cron", "fragment"),
    [
        ("0 0 L-2 * *", "'L' belongs in the day-of-month field"),
        ("L 0 * * *", "In the minute field"),
        ("0 0 * * 1#6", "from 1 to 5"),
        ("0 0 30W 2 *", "never fires"),
    ],
)
def test_a_misplaced_extension_is_a_400_naming_the_cron_field(api_a, cron, fragment):
    response = api_a.post(SCHEDULES, body(cron), format="json")

    assert response.status_code == 400
    assert fragment in response.json()["cron"][0]


def test_a_year_of_extension_fires_materialized_as_time_passes_is_exactly_the_preview(api_a, tenant_a, make_schedule):
    """Through both of New York's clock changes: the materializer walks the same days the preview lists, and
    reconcile expects exactly those."""
    crons = ["30 2 L * *", "0 9 15W * *", "0 9 * * fri#2", "0 18 * * 5L", "0 0 * * 1#5", "0 12 1,L * 5L"]
    previews = {}
    for index, cron in enumerate(crons):
        schedule = make_schedule(
            tenant_a.tenant, now=YEAR_START, name=f"extension-{index}", cron=cron, timezone="America/New_York"
        )
        fires = preview(api_a, body(cron), after=YEAR_START, count=100)
        previews[schedule.id] = [fire for fire in fires if fire < YEAR_END]
    states = materialize_as_previewed(
        "cron-extensions", previews, since=YEAR_START, until=YEAR_END, tenant_id=tenant_a.tenant.id
    )

    for schedule_id in previews:
        assert states[schedule_id] == {"scheduled"}, schedule_id


def test_a_dst_note_names_the_skipped_day_an_extension_selects_and_none_for_one_it_does_not():
    """New York springs forward on Sunday 8 March 2026, the month's second Sunday: 02:30 that day does not exist."""
    after = z(2026, 3, 1)

    def notes(cron: str) -> list[str]:
        fires = list(
            itertools.islice(TimeRule(kind="cron", cron=cron, timezone="America/New_York").iter_after(after), 2)
        )
        return [note.text for note in dst_notes(cron, "America/New_York", after=after, fires=fires)]

    assert notes("30 2 * * 0#2") == [
        "02:30 does not exist on 2026-03-08 in America/New_York: skipped (the clocks jump from 02:00 to 03:00)."
    ]
    assert notes("30 2 * * 0#3") == []
