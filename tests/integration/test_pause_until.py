"""Pause until: POST .../pause/ {"note", "resume_at"}, the schedule showing resume_at while paused, and the resume
by itself at resume_at, as a resume would and as a new version whose note says so (docs/API.md, "The time model")."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from core.clock import db_now
from dispatch.engine.materializer import Materializer
from dispatch.models import Occurrence
from schedules.models import Schedule, ScheduleVersion
from schedules.services import AUTO_RESUME_ACTOR, pause_schedule, resume_due_pauses, resume_schedule, update_schedule
from tests.integration.processes import run_manage
from tests.integration.test_admin_console import SCHEDULES_URL, change_url
from tests.integration.test_api_schedules import SCHEDULES

T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)


def z(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def hourly(api) -> dict:
    response = api.post(SCHEDULES, {"name": "h", "kind": "cron", "cron": "0 * * * *", "handler": "noop"}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_a_pause_keeps_its_note_on_the_version_and_shows_resume_at_until_it_ends(api_a):
    created = hourly(api_a)
    resume_at = (db_now() + timedelta(days=2)).replace(microsecond=0)

    paused = api_a.post(
        f"{SCHEDULES}{created['id']}/pause/",
        {"note": "upstream down, INC-42", "resume_at": resume_at.isoformat()},
        format="json",
    )

    assert paused.status_code == 200, paused.content
    assert (paused.json()["state"], z(paused.json()["resume_at"])) == ("paused", resume_at)
    version = ScheduleVersion.objects.get(schedule_id=created["id"], version=2)
    assert (version.change, version.note) == ("pause", "upstream down, INC-42")
    resumed = api_a.post(f"{SCHEDULES}{created['id']}/resume/")
    assert (resumed.json()["state"], resumed.json()["resume_at"]) == ("active", None)
    assert hourly(api_a)["resume_at"] is None, "null on a schedule never paused"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [({"resume_at": "2020-01-01T00:00:00Z"}, "future"), ({"resume_at": "soon"}, "ISO 8601"), ({"note": "x" * 501}, "")],
)
def test_a_resume_at_in_the_past_or_unreadable_is_a_400_naming_it_and_nothing_changes(api_a, body, fragment):
    created = hourly(api_a)

    response = api_a.post(f"{SCHEDULES}{created['id']}/pause/", body, format="json")

    assert response.status_code == 400, response.content
    field = next(iter(body))
    assert fragment in " ".join(response.json()[field])
    assert api_a.get(f"{SCHEDULES}{created['id']}/").json()["state"] == "active"


def test_a_pause_that_has_come_to_its_end_resumes_by_itself_at_resume_at_without_catching_up(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0, cron="*/10 * * * *")
    paused = pause_schedule(schedule, actor="test", note="maintenance", now=T0, resume_at=T0 + timedelta(hours=2))

    assert resume_due_pauses(now=T0 + timedelta(hours=1)) == 0, "not yet"
    assert resume_due_pauses(now=T0 + timedelta(hours=2, minutes=3)) == 1

    resumed = Schedule.objects.get(pk=paused.id)
    assert (resumed.state, resumed.resume_at, resumed.version) == ("active", None, 3)
    # As a resume at resume_at: the first fire after it, none of the pause's.
    assert resumed.next_run_at == T0 + timedelta(hours=2, minutes=10)
    version = ScheduleVersion.objects.get(schedule_id=paused.id, version=3)
    assert (version.change, version.actor, version.valid_from) == ("resume", AUTO_RESUME_ACTOR, T0 + timedelta(hours=2))
    assert version.note == "resumed by itself at its resume_at (2026-06-01T14:00:00Z)"
    assert resume_due_pauses(now=T0 + timedelta(hours=3)) == 0, "once"


def test_a_change_while_paused_keeps_the_pause_end_and_versions_stay_in_time_order(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0, cron="*/10 * * * *")
    pause_schedule(schedule, actor="test", now=T0, resume_at=T0 + timedelta(hours=1))
    changed = update_schedule(
        Schedule.objects.get(pk=schedule.id), {"cron": "*/5 * * * *"}, actor="t", now=T0 + timedelta(hours=1, minutes=2)
    )
    assert (changed.state, changed.resume_at) == ("paused", T0 + timedelta(hours=1))

    resume_due_pauses(now=T0 + timedelta(hours=1, minutes=4))

    versions = list(ScheduleVersion.objects.filter(schedule_id=schedule.id).order_by("version"))
    assert [v.change for v in versions] == ["create", "pause", "update", "resume"]
    assert versions[-1].valid_from == T0 + timedelta(hours=1, minutes=2), "not before the change it follows"
    assert all(a.valid_from <= b.valid_from for a, b in itertools.pairwise(versions))


def test_pausing_a_paused_schedule_again_moves_its_resume_at_without_a_version(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0)
    pause_schedule(schedule, actor="test", now=T0, resume_at=T0 + timedelta(hours=1))

    again = pause_schedule(Schedule.objects.get(pk=schedule.id), actor="test", now=T0, resume_at=T0 + timedelta(days=1))

    assert (again.resume_at, again.version) == (T0 + timedelta(days=1), 2)
    assert resume_due_pauses(now=T0 + timedelta(hours=2)) == 0


@pytest.mark.django_db(transaction=True)
def test_a_real_materializer_process_resumes_a_pause_whose_resume_at_has_come(tenant_a, api_a):
    created = hourly(api_a)
    resume_at = db_now() + timedelta(seconds=2)
    paused = api_a.post(f"{SCHEDULES}{created['id']}/pause/", {"resume_at": resume_at.isoformat()}, format="json")
    assert paused.status_code == 200, paused.content
    while db_now() <= resume_at:
        pass

    finished = run_manage("materialize", "--once", "--name", "pause-until-process")

    assert finished.returncode == 0, finished.stderr[-2000:]
    shown = api_a.get(f"{SCHEDULES}{created['id']}/").json()
    assert (shown["state"], shown["resume_at"], shown["version"]) == ("active", None, 3)
    assert Occurrence.objects.filter(schedule_id=created["id"]).count() <= 1, "no fire of the pause caught up"


def test_a_failing_duty_is_logged_and_the_maintenance_pass_goes_on(caplog):
    def broken() -> None:
        raise RuntimeError("boom")

    Materializer._run_duty(broken)

    assert "maintenance duty broken failed" in caplog.text


def test_the_console_pauses_until_an_instant_and_the_list_says_so(console, tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant)
    url = change_url(schedule).replace("/change/", "/operate/pause/")
    page = console.get(url)
    assert page.status_code == 200 and "Resume at (UTC)" in page.content.decode()

    response = console.post(url, {"note": "release freeze", "resume_at": "2030-01-02 09:00"})

    assert response.status_code == 302, response.content.decode()[:2000]
    schedule.refresh_from_db()
    assert (schedule.state, schedule.resume_at) == ("paused", datetime(2030, 1, 2, 9, tzinfo=UTC))
    assert "paused until 2030-01-02 09:00 UTC" in console.get(SCHEDULES_URL).content.decode()


def test_the_console_refuses_a_resume_at_in_the_past_on_the_form(console, tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant)
    url = change_url(schedule).replace("/change/", "/operate/pause/")

    response = console.post(url, {"resume_at": "2020-01-01 00:00"})

    assert response.status_code == 200
    assert "Must be in the future" in response.content.decode()
    schedule.refresh_from_db()
    assert schedule.state == "active"


def test_a_pause_ended_by_hand_and_paused_again_without_an_end_is_not_resumed_by_a_late_pass(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0)
    pause_schedule(schedule, actor="test", now=T0, resume_at=T0 + timedelta(hours=1))
    resumed = resume_schedule(Schedule.objects.get(pk=schedule.id), actor="user", now=T0 + timedelta(minutes=30))
    pause_schedule(resumed, actor="user", now=T0 + timedelta(minutes=40))

    assert resume_due_pauses(now=T0 + timedelta(hours=2)) == 0
    assert Schedule.objects.get(pk=schedule.id).state == "paused"


def test_a_pause_whose_rule_cannot_be_read_is_logged_and_the_others_resume(tenant_a, make_schedule, caplog):
    broken, fine = (make_schedule(tenant_a.tenant, now=T0, name=name) for name in ("broken", "fine"))
    for schedule in (broken, fine):
        pause_schedule(schedule, actor="test", now=T0, resume_at=T0 + timedelta(hours=1))
    # A zone the time rules no longer know (a tzdata update dropped it), stored before.
    Schedule.objects.filter(pk=broken.id).update(timezone="Mars/Olympus_Mons")

    assert resume_due_pauses(now=T0 + timedelta(hours=2)) == 1

    assert (Schedule.objects.get(pk=fine.id).state, Schedule.objects.get(pk=broken.id).state) == ("active", "paused")
    assert f"could not resume schedule {broken.id}" in caplog.text


def test_resume_and_cancel_keep_their_notes_on_the_versions_too(api_a):
    created = hourly(api_a)
    api_a.post(f"{SCHEDULES}{created['id']}/pause/", {"note": "freeze"}, format="json")

    resumed = api_a.post(f"{SCHEDULES}{created['id']}/resume/", {"note": "freeze over, CHG-9"}, format="json")
    canceled = api_a.delete(f"{SCHEDULES}{created['id']}/", {"note": "customer left"}, format="json")

    assert (resumed.status_code, canceled.status_code) == (200, 200)
    notes = dict(ScheduleVersion.objects.filter(schedule_id=created["id"]).values_list("change", "note"))
    assert (notes["resume"], notes["cancel"]) == ("freeze over, CHG-9", "customer left")
