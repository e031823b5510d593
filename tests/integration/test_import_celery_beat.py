"""`manage.py import_celery_beat` against a real django-celery-beat database.

The beat database is the module's own; django-celery-beat's migrations build its tables and its models write the
rows, in a subprocess under tests/celery_beat_settings.py (a bare celery-beat project). The command then imports
them into the acme tenant, in this process, through the services.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from psycopg import sql

from core.choices import ScheduleState
from schedules.celery_beat import ACTOR
from schedules.models import Schedule, ScheduleVersion
from schedules.services import pause_schedule
from tests.integration.databases import admin_connection, database_url, drop_database, manage_on
from tests.integration.processes import ROOT

BEAT_SETTINGS = "tests.celery_beat_settings"
START = datetime(2030, 1, 1, tzinfo=UTC)
RUN_AT = datetime(2030, 6, 1, 9, 0, tzinfo=UTC)
CAMPAIGN_START = datetime(2031, 1, 1, tzinfo=UTC)
CAMPAIGN_END = datetime(2031, 1, 31, 23, 0, tzinfo=UTC)
HANDLER_MAP = ("--handler-map", "reports.tasks.digest=noop")

# Prepended to every snippet: django-celery-beat's models, and a helper per schedule table.
PRELUDE = """
import django
django.setup()
from datetime import datetime, UTC
from zoneinfo import ZoneInfo
from django.core.management import call_command
from django_celery_beat.models import (
    ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule,
)

def cron(minute="*", hour="*", dom="*", month="*", dow="*", tz="UTC"):
    return CrontabSchedule.objects.create(
        minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow, timezone=ZoneInfo(tz)
    )

def every(n, period):
    return IntervalSchedule.objects.create(every=n, period=period)

def task(name, task, **fields):
    return PeriodicTask.objects.create(name=name, task=task, **fields)

def wipe():
    PeriodicTask.objects.all().delete()
    for model in (ClockedSchedule, CrontabSchedule, IntervalSchedule, SolarSchedule):
        model.objects.all().delete()

def change(name, **fields):
    row = PeriodicTask.objects.get(name=name)
    for key, value in fields.items():
        setattr(row, key, value)
    row.save()
"""

# The tasks of a small celery-beat project: one of each mapping rule.
STANDARD_TASKS = """
wipe()
task("nightly-report", "log", crontab=cron("30", "2", tz="America/New_York"),
     args='["sales", 3]', kwargs='{"region": "eu"}', queue="reports", priority=5)
task("weekday-digest", "reports.tasks.digest", crontab=cron("0", "9", dow="mon-fri", tz="Europe/Madrid"))
task("poll-inbox", "noop", interval=every(90, "seconds"), start_time=datetime(2030, 1, 1, tzinfo=UTC))
task("warm-up", "noop", interval=every(2, "hours"), one_off=True)
task("welcome-email", "log", clocked=ClockedSchedule.objects.create(clocked_time=datetime(2030, 6, 1, 9, tzinfo=UTC)),
     one_off=True, kwargs='{"to": "new-user@example.com"}')
task("paused-report", "log", crontab=cron("0", "6"), enabled=False)
task("january-campaign", "log", crontab=cron("0", "10", dow="1-5", tz="Europe/Madrid"),
     start_time=datetime(2031, 1, 1, tzinfo=UTC), expires=datetime(2031, 1, 31, 23, tzinfo=UTC))
task("sunset-lights", "log", solar=SolarSchedule.objects.create(event="sunset", latitude="40.4", longitude="-3.7"))
task("legacy-cleanup", "proj.tasks.cleanup", crontab=cron("0", "4"))
"""
IMPORTED = {
    "nightly-report",
    "weekday-digest",
    "poll-inbox",
    "warm-up",
    "welcome-email",
    "paused-report",
    "january-campaign",
}


def run_beat(url: str, code: str) -> None:
    """Run `code` in the celery-beat project on the beat database (its models load only under its settings)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": BEAT_SETTINGS, "BEAT_DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def beat_database(django_db_setup) -> Iterator[str]:
    """A database of this module's own, named after the test database, migrated by django-celery-beat itself."""
    name = f"{settings.DATABASES['default']['NAME']}_celery_beat"
    drop_database(name)
    with admin_connection() as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = database_url(name)
    try:
        run_beat(url, "call_command('migrate', verbosity=0)")
        yield url
    finally:
        drop_database(name)


@pytest.fixture
def beat(beat_database: str) -> str:
    """The beat database holding STANDARD_TASKS (and only them)."""
    run_beat(beat_database, STANDARD_TASKS)
    return beat_database


def import_beat(url: str, *args: str, tenant: str = "acme") -> dict:
    """Run the command; its last line is one JSON object."""
    out = StringIO()
    call_command("import_celery_beat", "--from-database", url, "--tenant", tenant, *args, stdout=out)
    return json.loads(out.getvalue().splitlines()[-1])


def schedules_of(tenant) -> dict[str, Schedule]:
    return {schedule.name: schedule for schedule in Schedule.objects.for_tenant(tenant)}


def reasons(report: dict) -> dict[str, str]:
    return {skip["name"]: skip["reason"] for skip in report["skipped"]}


def test_each_kind_of_periodic_task_becomes_its_schedule(tenant, beat):
    report = import_beat(beat, *HANDLER_MAP)

    assert (report["imported"], report["updated"], report["unchanged"]) == (7, 0, 0)
    assert set(reasons(report)) == {"sunset-lights", "legacy-cleanup"}
    assert "solar" in reasons(report)["sunset-lights"]
    assert "'proj.tasks.cleanup' is not a registered handler" in reasons(report)["legacy-cleanup"]
    assert "--handler-map proj.tasks.cleanup=HANDLER" in reasons(report)["legacy-cleanup"]
    got = schedules_of(tenant)
    assert set(got) == IMPORTED

    nightly = got["nightly-report"]
    assert (nightly.kind, nightly.cron, nightly.timezone, nightly.handler) == (
        "cron",
        "30 2 * * *",
        "America/New_York",
        "log",
    )
    assert nightly.payload == {"args": ["sales", 3], "kwargs": {"region": "eu"}}
    assert nightly.state == ScheduleState.ACTIVE and nightly.max_runs is None
    warned = {w["warning"].split(" ")[0] for w in report["warnings"] if w["name"] == "nightly-report"}
    assert warned == {"queue", "priority"}

    digest = got["weekday-digest"]  # mapped with --handler-map
    assert (digest.cron, digest.timezone, digest.handler) == ("0 9 * * mon-fri", "Europe/Madrid", "noop")
    assert digest.payload == {"args": [], "kwargs": {}}

    poll = got["poll-inbox"]
    assert (poll.kind, poll.every_seconds, poll.anchor_at, poll.start_at) == ("interval", 90, START, START)

    warm_up = got["warm-up"]  # one_off
    assert (warm_up.kind, warm_up.every_seconds, warm_up.max_runs, warm_up.remaining_runs_now) == (
        "interval",
        7200,
        1,
        1,
    )

    welcome = got["welcome-email"]  # clocked
    assert (welcome.kind, welcome.run_at, welcome.max_runs) == ("once", RUN_AT, None)
    assert welcome.payload == {"args": [], "kwargs": {"to": "new-user@example.com"}}

    campaign = got["january-campaign"]
    assert (campaign.cron, campaign.start_at, campaign.end_at) == ("0 10 * * 1-5", CAMPAIGN_START, CAMPAIGN_END)

    paused = got["paused-report"]  # enabled=False
    assert paused.state == ScheduleState.PAUSED
    versions = list(ScheduleVersion.objects.filter(schedule=paused).order_by("version"))
    assert [v.change for v in versions] == ["create", "pause"]
    assert versions[1].actor.startswith(f"{ACTOR}/task-")
    task_id = versions[1].actor.rsplit("-", 1)[1]
    assert versions[1].note == f"celery-beat periodic task {task_id} (paused-report) is disabled"
    actors = set(ScheduleVersion.objects.filter(schedule__tenant=tenant).values_list("actor", flat=True))
    assert actors and all(actor.startswith(f"{ACTOR}/task-") for actor in actors)


def test_a_dry_run_writes_nothing_and_counts_as_the_real_run_does(tenant, beat):
    dry = import_beat(beat, *HANDLER_MAP, "--dry-run")

    assert dry["dry_run"] is True
    assert not Schedule.objects.for_tenant(tenant).exists()
    assert not ScheduleVersion.objects.filter(tenant=tenant).exists()
    real = import_beat(beat, *HANDLER_MAP)
    assert (dry["imported"], dry["updated"]) == (real["imported"], real["updated"]) == (7, 0)
    assert dry["skipped"] == real["skipped"] and len(dry["skipped"]) == 2
    assert dry["warnings"] == real["warnings"]


def test_the_quota_skips_the_tasks_past_it_and_a_dry_run_says_so_too(tenant, beat):
    tenant.max_schedules = 3
    tenant.save(update_fields=["max_schedules"])

    dry = import_beat(beat, *HANDLER_MAP, "--dry-run")
    real = import_beat(beat, *HANDLER_MAP)

    assert dry["imported"] == real["imported"] == 3
    assert dry["skipped"] == real["skipped"]
    over = [name for name, reason in reasons(real).items() if "its quota is 3" in reason]
    assert len(over) == 4
    assert Schedule.objects.for_tenant(tenant).count() == 3


def test_a_second_run_imports_nothing_new(tenant, beat):
    import_beat(beat, *HANDLER_MAP)
    versions = ScheduleVersion.objects.filter(tenant=tenant).count()

    again = import_beat(beat, *HANDLER_MAP)

    assert (again["imported"], again["updated"], again["unchanged"]) == (0, 0, 7)
    assert set(reasons(again)) == {"sunset-lights", "legacy-cleanup"}
    assert Schedule.objects.for_tenant(tenant).count() == 7
    assert ScheduleVersion.objects.filter(tenant=tenant).count() == versions


def test_a_task_changed_in_beat_is_updated_on_the_next_run(tenant, beat):
    import_beat(beat, *HANDLER_MAP)
    before = schedules_of(tenant)
    run_beat(
        beat,
        """
        change("nightly-report", crontab=cron("30", "3", tz="America/New_York"), kwargs='{"region": "us"}')
        change("poll-inbox", interval=every(2, "minutes"))
        change("weekday-digest", enabled=False)
        change("paused-report", enabled=True)
        """,
    )

    dry = import_beat(beat, *HANDLER_MAP, "--dry-run")
    assert (dry["imported"], dry["updated"], dry["unchanged"]) == (0, 4, 3)
    assert {s.name: s.version for s in schedules_of(tenant).values()} == {n: s.version for n, s in before.items()}

    report = import_beat(beat, *HANDLER_MAP)

    assert (report["imported"], report["updated"], report["unchanged"]) == (0, 4, 3)
    after = schedules_of(tenant)
    nightly = after["nightly-report"]
    assert (nightly.cron, nightly.payload["kwargs"], nightly.version) == ("30 3 * * *", {"region": "us"}, 2)
    poll = after["poll-inbox"]
    assert (poll.every_seconds, poll.anchor_at) == (120, START)
    assert after["weekday-digest"].state == ScheduleState.PAUSED
    assert after["paused-report"].state == ScheduleState.ACTIVE
    resume = ScheduleVersion.objects.filter(schedule=after["paused-report"]).latest("version")
    assert resume.change == "resume" and resume.note.endswith("(paused-report) is enabled")
    assert import_beat(beat, *HANDLER_MAP)["updated"] == 0


def test_a_pause_made_by_someone_else_is_not_undone(tenant, beat):
    import_beat(beat, *HANDLER_MAP)
    pause_schedule(schedules_of(tenant)["nightly-report"], actor="tenant:acme/api", note="upstream down")

    report = import_beat(beat, *HANDLER_MAP)

    assert report["updated"] == 0
    assert schedules_of(tenant)["nightly-report"].state == ScheduleState.PAUSED
    warnings = [w["warning"] for w in report["warnings"] if w["name"] == "nightly-report"]
    assert any("left paused here: tenant:acme/api set that" in w for w in warnings), warnings


def test_crontabs_keep_celery_meaning_and_what_cannot_be_said_is_skipped(tenant, beat_database):
    run_beat(
        beat_database,
        """
        wipe()
        task("night-watch", "noop", crontab=cron("*/15", "22-2"))
        task("monday-mornings", "noop", crontab=cron("0", "9", dom="1-31", dow="monday"))
        task("first-monday", "noop", crontab=cron("0", "9", dom="1-7", dow="mon"))
        task("every-2s", "noop", interval=every(2_000_000, "microseconds"))
        task("every-1.5s", "noop", interval=every(1_500_000, "microseconds"))
        task("every-400-days", "noop", interval=every(400, "days"))
        task("bad-args", "noop", interval=every(1, "minutes"), args="[1,")
        task("list-kwargs", "noop", interval=every(1, "minutes"), kwargs="[1]")
        task("expired", "noop", crontab=cron("0", "1"), expires=datetime(2020, 1, 1, tzinfo=UTC))
        """,
    )

    report = import_beat(beat_database)

    got = schedules_of(tenant)
    assert got["night-watch"].cron == "*/15 0-2,22-23 * * *"  # celery wraps 22-2 around midnight
    assert got["monday-mornings"].cron == "0 9 * * 1"  # 1-31 is every day: AND with Mondays is Mondays
    assert got["every-2s"].every_seconds == 2
    skipped = reasons(report)
    assert set(skipped) == {"first-monday", "every-1.5s", "every-400-days", "bad-args", "list-kwargs", "expired"}
    assert "both day_of_month '1-7' and day_of_week 'mon'" in skipped["first-monday"]
    assert "whole seconds" in skipped["every-1.5s"]
    assert skipped["every-400-days"] == "every_seconds: Must be an integer from 1 to 31536000."
    assert "args are not valid JSON" in skipped["bad-args"]
    assert "kwargs must be a JSON object" in skipped["list-kwargs"]
    assert "nothing left to run" in skipped["expired"]
    assert report["imported"] == 3 == len(got)


def test_bad_input_is_a_one_line_error(tenant, beat):
    unreachable = "postgres://postgres:s3cret@127.0.0.1:1/nowhere"
    with pytest.raises(CommandError, match=r"^Cannot read postgres://postgres@127\.0\.0\.1:1/nowhere: ") as caught:
        import_beat(unreachable)
    assert "\n" not in str(caught.value) and "s3cret" not in str(caught.value)
    with pytest.raises(CommandError, match=r"^Unknown tenant 'nope'\.$"):
        import_beat(beat, tenant="nope")
    with pytest.raises(CommandError, match="must be a PostgreSQL URL"):
        import_beat("mysql://root@127.0.0.1/beat")
    product_database = database_url(settings.DATABASES["default"]["NAME"])
    with pytest.raises(CommandError, match=r"^No django-celery-beat tables in "):
        import_beat(product_database)
    with pytest.raises(CommandError, match="takes TASK=HANDLER"):
        import_beat(beat, "--handler-map", "reports.tasks.digest")
    with pytest.raises(CommandError, match="unknown handler 'nope'"):
        import_beat(beat, "--handler-map", "reports.tasks.digest=nope")
    assert not Schedule.objects.for_tenant(tenant).exists()


def test_the_command_line_prints_the_error_without_a_traceback(tenant):
    done = manage_on(
        settings.DATABASES["default"]["NAME"],
        "import_celery_beat",
        "--from-database",
        "postgres://postgres@127.0.0.1:1/nowhere",
        "--tenant",
        "acme",
        timeout=120,
    )

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("CommandError: Cannot read postgres://postgres@127.0.0.1:1/nowhere: ")
