"""A cron schedule's DST policy (dst_gap, dst_repeat) through the API, the materializer and reconcile: stored,
previewed with its marks, refused where it means nothing, and materialized on exactly the previewed instants through
clock changes (docs/API.md, "The time model")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatch.backfill import backfill_schedule
from dispatch.reconcile import reconcile
from schedules.models import ScheduleVersion
from tests.integration.support import form_data, materialize_as_previewed
from tests.integration.test_admin_console import SCHEDULES_URL, change_url
from tests.integration.test_admin_console import preview as console_preview
from tests.integration.test_api_schedules import SCHEDULES

NEW_YORK = "America/New_York"


def z(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# Materialized and never run by a worker, every row would be stuck: these tests are about gaps.
pytestmark = pytest.mark.usefixtures("gaps_only")


def body(cron: str, zone: str = NEW_YORK, **policy) -> dict:
    return {"name": "dst", "kind": "cron", "cron": cron, "timezone": zone, "handler": "noop", **policy}


def preview(api, definition: dict, *, after: datetime, count: int) -> list[dict]:
    response = api.post(
        f"{SCHEDULES}preview/", {**definition, "after": after.isoformat(), "count": count}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()["fires"]


def test_a_schedule_without_a_policy_shows_both_fields_null(api_a):
    created = api_a.post(SCHEDULES, body("30 2 * * *"), format="json")

    assert created.status_code == 201, created.content
    assert (created.json()["dst_gap"], created.json()["dst_repeat"]) == (None, None)


def test_a_policy_is_stored_shown_and_each_change_is_a_new_version(api_a):
    created = api_a.post(SCHEDULES, body("30 2 * * *", dst_gap="shift", dst_repeat="both"), format="json")
    assert created.status_code == 201, created.content
    assert (created.json()["dst_gap"], created.json()["dst_repeat"]) == ("shift", "both")
    url = f"{SCHEDULES}{created.json()['id']}/"

    patched = api_a.patch(url, {"dst_repeat": "last"}, format="json")

    assert patched.status_code == 200, patched.content
    assert (patched.json()["dst_gap"], patched.json()["dst_repeat"], patched.json()["version"]) == ("shift", "last", 2)
    versions = ScheduleVersion.objects.filter(schedule_id=created.json()["id"]).order_by("version")
    assert [version.definition["dst_repeat"] for version in versions] == ["both", "last"]


def test_shift_fires_the_skipped_time_at_the_offset_from_before_the_change_and_marks_it(api_a):
    fires = preview(api_a, body("30 2 * * *", dst_gap="shift"), after=z(2026, 3, 7, 12), count=2)

    assert fires == [
        {"at": "2026-03-08T07:30:00Z", "local": "2026-03-08T03:30:00-04:00", "dst": "shifted"},
        {"at": "2026-03-09T06:30:00Z", "local": "2026-03-09T02:30:00-04:00"},
    ]


@pytest.mark.parametrize(
    ("repeat", "instants"),
    [
        (None, ["2026-11-01T05:30:00Z"]),
        ("first", ["2026-11-01T05:30:00Z"]),
        ("last", ["2026-11-01T06:30:00Z"]),
        ("both", ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"]),
    ],
)
def test_a_repeated_time_is_previewed_at_the_instants_its_policy_names(api_a, repeat, instants):
    fires = preview(api_a, body("30 1 * * *", dst_repeat=repeat), after=z(2026, 10, 31, 12), count=len(instants) + 1)

    assert [fire["at"] for fire in fires[: len(instants)]] == instants
    assert {fire["dst"] for fire in fires[: len(instants)]} == {"repeated"}
    assert fires[-1] == {"at": "2026-11-02T06:30:00Z", "local": "2026-11-02T01:30:00-05:00"}, "no mark: no change"


@pytest.mark.parametrize(
    ("definition", "field", "fragment"),
    [
        ({"kind": "interval", "every_seconds": 60, "dst_repeat": "first"}, "dst_repeat", "kind 'cron'"),
        ({"kind": "once", "run_at": "2027-01-01T00:00:00Z", "dst_gap": "shift"}, "dst_gap", "kind 'cron'"),
        ({"kind": "cron", "cron": "0 2 * * *", "dst_gap": "later"}, "dst_gap", "skip, shift"),
        ({"kind": "cron", "cron": "0 2 * * *", "dst_repeat": "twice"}, "dst_repeat", "first, last, both"),
        ({"kind": "cron", "cron": "0 2 * * *", "dst_repeat": 2}, "dst_repeat", ""),
    ],
)
def test_a_policy_where_it_means_nothing_or_an_unknown_one_is_a_400_naming_the_field(
    api_a, definition, field, fragment
):
    for path in (SCHEDULES, f"{SCHEDULES}preview/"):
        response = api_a.post(path, {"name": "dst", "handler": "noop", **definition}, format="json")

        assert response.status_code == 400, response.content
        assert fragment in response.json()[field][0]


def test_switching_a_cron_schedule_to_an_interval_drops_its_policy(api_a):
    created = api_a.post(SCHEDULES, body("30 2 * * *", dst_gap="shift"), format="json")

    patched = api_a.patch(
        f"{SCHEDULES}{created.json()['id']}/", {"kind": "interval", "every_seconds": 60}, format="json"
    )

    assert patched.status_code == 200, patched.content
    assert (patched.json()["dst_gap"], patched.json()["dst_repeat"]) == (None, None)


POLICIES = [("skip", "first"), ("shift", "first"), ("skip", "last"), ("skip", "both"), ("shift", "both")]
CRONS = ["30 2 * * *", "30 1 * * *", "*/20 0-3 * * *", "0 2 * * 0", "45 1 * * 0#1"]


@pytest.mark.parametrize(
    ("zone", "since"),
    [
        (NEW_YORK, z(2026, 3, 5)),
        (NEW_YORK, z(2026, 10, 29)),
        ("Australia/Lord_Howe", z(2026, 4, 1)),
        ("Australia/Lord_Howe", z(2026, 10, 1)),
    ],
)
def test_each_policy_materialized_through_a_clock_change_is_exactly_the_preview(
    api_a, tenant_a, make_schedule, zone, since
):
    """A week around each clock change of the zone (Lord Howe's are half an hour), with a driven clock: the
    materializer writes the fires the preview lists under each policy, no more, no fewer, and reconcile expects
    exactly those."""
    until = since + timedelta(days=7)
    previews = {}
    for index, ((gap, repeat), cron) in enumerate((policy, cron) for policy in POLICIES for cron in CRONS):
        schedule = make_schedule(
            tenant_a.tenant, now=since, name=f"dst-{index}", cron=cron, timezone=zone, dst_gap=gap, dst_repeat=repeat
        )
        fires, after = [], since
        while True:
            page = [
                datetime.fromisoformat(f["at"])
                for f in preview(api_a, body(cron, zone, dst_gap=gap, dst_repeat=repeat), after=after, count=100)
            ]
            fires += [fire for fire in page if fire < until]
            if not page or page[-1] >= until:
                break
            after = page[-1]
        previews[schedule.id] = fires
    assert len({tuple(fires) for fires in previews.values()}) > len(CRONS)  # the policies changed something
    states = materialize_as_previewed("dst-policy", previews, since=since, until=until, tenant_id=tenant_a.tenant.id)

    for schedule_id in previews:
        assert states[schedule_id] <= {"scheduled"}, schedule_id
    assert ScheduleVersion.objects.filter(schedule_id__in=previews, definition__dst_repeat="both").count() == 2 * len(
        CRONS
    )


# --- the console ---------------------------------------------------------------------------------------------------


def test_the_change_form_offers_the_policy_and_saving_it_is_a_new_version(console, tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, cron="30 2 * * *", timezone=NEW_YORK)
    page = console.get(change_url(schedule)).content.decode()
    assert "Skipped local times" in page and "Default (skip)" in page and "Default (first)" in page

    response = console.post(change_url(schedule), form_data(schedule, dst_gap="shift", dst_repeat="both"))

    assert response.status_code == 302, response.content.decode()[:2000]
    schedule.refresh_from_db()
    assert (schedule.dst_gap, schedule.dst_repeat, schedule.version) == ("shift", "both", 2)
    assert ScheduleVersion.objects.get(schedule=schedule, version=2).definition["dst_gap"] == "shift"
    listed = console.get(SCHEDULES_URL).content.decode()
    assert "skipped local times shifted, repeated local times fire twice" in listed


def test_the_live_preview_notes_the_shifted_fire_beside_it(console):
    status, body = console_preview(
        console,
        {
            "kind": "cron",
            "cron": "30 2 * * *",
            "timezone": NEW_YORK,
            "dst_gap": "shift",
            "after": "2026-03-07T12:00:00Z",
        },
    )

    assert status == 200, body
    first = body["fires"][0]
    assert (first["at"], first["note"]) == (
        "2026-03-08T07:30:00Z",
        "02:30 does not exist on 2026-03-08 in America/New_York: shifted by the clock change, fires at 03:30 EDT "
        "(the clocks jump from 02:00 to 03:00; dst_gap 'shift').",
    )
    assert body["notes"][0]["kind"] == "shifted"


def test_backfill_recreates_both_instants_of_a_repeated_time_and_nothing_outside_the_window(tenant_a, make_schedule):
    """A fall-back night in New York lost (no materializer ran): backfill creates the fires reconcile expects under
    the schedule's policy and window, both instants of 01:30 and nothing after end_at, each once."""
    since, until = z(2026, 10, 31, 12), z(2026, 11, 3)
    schedule = make_schedule(
        tenant_a.tenant,
        now=since,
        cron="30 1 * * *",
        timezone=NEW_YORK,
        dst_repeat="both",
        end_at=z(2026, 11, 2, 12),
        max_runs=10,
    )
    window = {"since": since, "until": until, "tenant_id": tenant_a.tenant.id, "now": until}
    assert [gap.scheduled_for for gap in reconcile(**window).gaps] == [
        z(2026, 11, 1, 5, 30),
        z(2026, 11, 1, 6, 30),
        z(2026, 11, 2, 6, 30),
    ]

    result = backfill_schedule(schedule.id, since=since, until=until, now=until)

    assert (result.expected, result.created) == (3, 3)
    assert reconcile(**window).ok
    assert backfill_schedule(schedule.id, since=since, until=until, now=until).created == 0
