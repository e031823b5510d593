"""Every `manage.py bench` subcommand, end to end at a tiny size: a benchmark that cannot run fails CI.

Each runs as an operator runs it (`manage.py bench ...`, its own processes), on a database of its own created and
migrated here, so they run side by side: the burst-shaped ones wait for the same minute boundary, and the whole
module costs about one of them. Each is checked by its last line, the JSON object: the keys the API promises, nothing
lost, and figures only the real processes produce (their peak memory, the broker's read-back, the workers' attempts).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from dispatch.bench.peer_beat import beat_installed
from tests.integration.databases import (
    database_url,
    deployment_env,
    drop_database,
    fresh_database,
    manage_on,
)
from tests.integration.processes import ROOT
from tests.support import wait_for

# make test-long deals out its tests file by file (--dist loadfile): one worker runs them all, so the module fixture
# that starts every benchmark runs once, not on each worker.
pytestmark = [pytest.mark.slow, pytest.mark.long]

# Fires due at one minute boundary: a horizon of 2 s lets the bench choose the next boundary ~20 s ahead.
TINY = ("--horizon", "2", "--deadline", "90")
# Where --lags-out writes (a fresh directory per test session: the module-scoped runs share it).
LAGS_DIR = Path(tempfile.mkdtemp(prefix="bench-lags-"))
BENCHES: dict[str, tuple[str, ...]] = {
    # Every schedule names a calendar (of days after the run): the materializer's calendar path end to end.
    "burst": (
        *("burst", "--schedules", "300", "--tenants", "3", "--calendar-dates", "3"),
        *("--lags-out", str(LAGS_DIR / "burst.txt"), *TINY),
    ),
    # A fault command that strikes nothing: it runs beside the drain, with T0 in its environment.
    "drain": (
        "drain",
        "--occurrences",
        "300",
        "--workers",
        "1",
        "--concurrency",
        "2",
        "--fault",
        'echo "at $T0"',
        *TINY,
    ),
    "fairness": ("fairness", "--big", "300", "--small", "30", *TINY),
    "fleet": ("fleet", "--schedules", "40"),
    "steady": ("steady", "--rate", "20", "--tenants", "10", "--minutes", "0.5", "--horizon", "10"),
    "celery-noop": ("celery-noop", "--tasks", "300", "--concurrency", "2"),
    "peer-beat": ("peer-beat", "--tasks", "30", "--deadline", "90", "--lags-out", str(LAGS_DIR / "peer-beat.txt")),
}
# The keys of each benchmark's JSON line that the API (Commands) promises.
PROMISED_KEYS = {
    "burst": {"schedules", "enqueued", "lost", "lag_p50_s", "lag_p95_s", "lag_p99_s", "lag_max_s", "dispatch_per_s"},
    "fairness": {"big_lag_p99_s", "small_lag_p99_s", "big_lost", "small_lost", "lost"},
    "fleet": {"schedules", "bulk_pause_per_s", "bulk_dry_run_per_s", "export_per_s", "apply_unchanged_per_s"}
    | {"apply_updated_per_s", "rss_mb_peak"},
    "drain": {"executed_per_s", "start_lag_p50_s", "start_lag_p99_s", "finish_p99_s", "lost", "duplicate_effects"}
    | {"attempts"},
    "steady": {"rate", "fires", "lost", "duplicate_effects", "lag_p50_s", "lag_p99_s", "lag_max_s", "settle_lag_p99_s"}
    | {"start_lag_p99_s", "outbox_rows_max", "outbox_rows_end", "rss_mb_max", "rss_mb_growth", "dead_tuples_max"}
    | {"bytes_per_fire"},
    "celery-noop": {"tasks", "executed", "executed_per_s"},
    "peer-beat": {"tasks", "enqueued", "lost", "lag_p50_s", "lag_p99_s", "lag_max_s", "dispatch_per_s"},
}
RUN_TIMEOUT_SECONDS = 300
# The fairness bench runs where a real tenant already lives (a schedule due in two days and a paused hourly one):
# it must run beside them and leave every row of theirs as it found it.
OTHER_TENANT = "other-1"
_OTHER_TENANT_SETUP = f"""
from datetime import timedelta
from core.clock import db_now
from schedules.models import Schedule
from schedules.services import create_schedule, pause_schedule
from tenants.services import provision_tenant
tenant = provision_tenant("{OTHER_TENANT}", domain="{OTHER_TENANT}.localhost").tenant
run_at = db_now() + timedelta(days=2)
create_schedule(tenant=tenant, actor="test", data=dict(name="later", kind="once", run_at=run_at, handler="noop"))
hourly, _ = create_schedule(
    tenant=tenant, actor="test", data=dict(name="hourly", kind="cron", cron="0 * * * *", timezone="UTC", handler="noop")
)
pause_schedule(Schedule.objects.get(pk=hourly.pk), actor="test")
"""
# What the other tenant owns, counted per table (the bench must change none of it).
_OTHER_TENANT_ROWS = """
SELECT (SELECT count(*) FROM schedules_schedule WHERE tenant_id = t.id),
       (SELECT count(*) FROM schedules_schedule WHERE tenant_id = t.id AND state = 'paused'),
       (SELECT count(*) FROM schedules_scheduleversion v JOIN schedules_schedule s ON s.id = v.schedule_id
         WHERE s.tenant_id = t.id),
       (SELECT count(*) FROM schedules_schedulecursor WHERE tenant_id = t.id),
       (SELECT count(*) FROM dispatch_occurrence WHERE tenant_id = t.id),
       (SELECT count(*) FROM dispatch_outboxmessage WHERE tenant_id = t.id)
FROM tenants_tenant t WHERE t.slug = %s
"""


@dataclass
class BenchRun:
    name: str
    database: str
    process: subprocess.Popen
    log: str = ""
    # The other tenant's row counts before and after the run, and the bench tenants left after it (fairness).
    others_before: list[tuple] | None = None
    others_after: list[tuple] | None = None
    bench_tenants_after: list[tuple] | None = None

    def result(self) -> dict:
        lines = self.log.strip().splitlines()
        assert self.process.returncode == 0, f"bench {self.name} exited {self.process.returncode}:\n{self.log[-4000:]}"
        assert lines, f"bench {self.name} printed nothing"
        return json.loads(lines[-1])


def _manage(database: str, *args: str) -> None:
    done = manage_on(database, *args, timeout=180)
    assert done.returncode == 0, f"manage.py {args[0]} on {database} failed:\n{done.stderr[-4000:]}"


def _query(database: str, statement: str, params: list) -> list[tuple]:
    with psycopg.connect(database_url(database)) as conn:
        return conn.execute(statement, params).fetchall()


@pytest.fixture(scope="module")
def bench_runs() -> Iterator[dict[str, BenchRun]]:
    """Start every runnable benchmark at once, each on its own fresh database, and wait for all of them."""
    base = f"{settings.DATABASES['default']['NAME']}_bench"
    runs: dict[str, BenchRun] = {}
    try:
        for name in BENCHES:
            database = f"{base}_{name.replace('-', '_')}"
            fresh_database(database)
            others_before = None
            if name == "fairness":
                _manage(database, "shell", "-c", _OTHER_TENANT_SETUP)
                others_before = _query(database, _OTHER_TENANT_ROWS, [OTHER_TENANT])
            process = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "bench", *BENCHES[name]],
                env=deployment_env(database),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            runs[name] = BenchRun(name, database, process, others_before=others_before)
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        for run in runs.values():
            try:
                run.log, _ = run.process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                run.process.kill()
                run.log, _ = run.process.communicate()
        for run in runs.values():
            if run.others_before is not None:
                run.others_after = _query(run.database, _OTHER_TENANT_ROWS, [OTHER_TENANT])
                run.bench_tenants_after = _query(
                    run.database, "SELECT slug FROM tenants_tenant WHERE slug LIKE %s", ["bench-%"]
                )
        yield runs
    finally:
        for run in runs.values():
            if run.process.poll() is None:
                run.process.kill()
                run.process.wait()
            drop_database(run.database)


@pytest.mark.parametrize("name", list(BENCHES))
def test_the_benchmark_runs_and_its_json_line_has_the_promised_keys(bench_runs, name):
    result = bench_runs[name].result()
    assert PROMISED_KEYS[name] <= set(result), f"missing: {PROMISED_KEYS[name] - set(result)}"
    assert result.get("lost", 0) == 0


def test_burst_went_through_a_real_materializer_and_relay_to_the_broker(bench_runs):
    result = bench_runs["burst"].result()
    assert result["calendar_dates"] == 3
    assert result["schedules"] == result["enqueued"] == 300
    assert result["lost_on_broker"] == 0 and result["duplicates"] == 0, bench_runs["burst"].log[-3000:]
    assert result["broker_messages"] >= 2  # 300 fires in messages of at most 250, read back from the queue
    assert result["materialize_per_s"] > 0
    assert set(result["peak_rss_mb"]) == {"materializer-1", "relay-1"}
    assert all(mb > 20 for mb in result["peak_rss_mb"].values())
    assert 0 <= result["lag_p50_s"] <= result["lag_p99_s"] <= result["lag_max_s"] < 90
    assert len((LAGS_DIR / "burst.txt").read_text().splitlines()) == 300


def test_fleet_changed_every_schedule_and_left_no_rows(bench_runs):
    run = bench_runs["fleet"]
    result = run.result()
    assert (result["apply_unchanged_count"], result["apply_updated_count"]) == (40, 40)
    assert result["bulk_pause_bytes"] > 40 * 50  # one result per schedule
    assert _query(run.database, "SELECT count(*) FROM tenants_tenant WHERE slug = 'bench-fleet'", []) == [(0,)]


def test_drain_ran_every_fire_once_through_a_real_worker(bench_runs):
    result = bench_runs["drain"].result()
    assert result["executed"] == 300, result
    assert result["effects"] == 300 and result["duplicate_effects"] == 0
    assert result["attempts"] >= 300
    assert {"materializer-1", "relay-1", "worker-1"} <= set(result["peak_rss_mb"])
    assert result["executed_per_s"] > 0
    assert 0 <= result["start_lag_p50_s"] <= result["start_lag_p99_s"]
    assert result["reconcile"] == {"ok": True, "expected": 300, "missing": 0, "stuck": 0, "unexpected": 0}
    # Started before T0 with the burst instant in its environment (a whole minute, give or take the clock's mapping).
    t0 = float(result["fault"]["output"][-1].removeprefix("at "))
    assert result["fault"]["exit"] == 0 and abs(t0 - round(t0)) < 0.05, result["fault"]


def test_fairness_measured_both_tenants_apart(bench_runs):
    result = bench_runs["fairness"].result()
    assert (result["big_enqueued"], result["small_enqueued"]) == (300, 30)
    assert result["big_lost"] == result["small_lost"] == 0
    assert set(result["peak_rss_mb"]) == {"materializer-1", "relay-1"}
    assert result["small_lag_p99_s"] < 90


def test_fairness_ran_beside_another_tenant_and_left_its_rows_as_they_were(bench_runs):
    run = bench_runs["fairness"]
    run.result()
    [(schedules, paused, versions, cursors, _occurrences, _envelopes)] = run.others_before
    assert (schedules, paused, cursors) == (2, 1, 1), "set up: two schedules, one paused (no cursor while paused)"
    assert versions >= 2
    assert run.others_after == run.others_before, "the bench touched none of the other tenant's rows"
    assert run.bench_tenants_after == [], "and removed its own tenants"


def test_steady_ran_every_fire_of_its_window_through_every_process(bench_runs):
    result = bench_runs["steady"].result()
    assert result["expected"] == result["fires"] == 20 * 30  # 20 fires in each second of a 30 s window
    assert result["states"] == {"succeeded": 600}
    assert result["duplicate_effects"] == 0 and result["unconfirmed"] == 0
    assert {"materializer", "relay", "worker"} <= set(result["rss_mb_max"])
    assert result["settled_envelopes"] > 0
    assert 0 <= result["lag_p50_s"] <= result["lag_p99_s"] <= result["lag_max_s"] < 30
    assert result["start_lag_p99_s"] is not None and result["start_lag_p99_s"] >= 0
    assert result["bytes_per_fire"] > 0
    assert {"schedules_schedulecursor", "dispatch_outboxmessage", "dispatch_occurrence"} <= set(
        result["dead_tuples_max"]
    )


def test_celery_noop_ran_every_task_on_a_real_worker(bench_runs):
    result = bench_runs["celery-noop"].result()
    assert result["tasks"] == result["executed"] == 300
    assert result["executed_per_s"] > 0


def test_peer_beat_delivered_every_task_through_beat(bench_runs):
    assert beat_installed(), "requirements-dev.txt installs requirements-bench.txt, which has django-celery-beat"
    result = bench_runs["peer-beat"].result()
    assert result["tasks"] == result["enqueued"] == 30
    assert result["duplicates"] == 0 and result["finished"] is True
    assert result["peak_rss_mb"] > 20  # beat itself, a process of its own
    assert 0 <= result["lag_p50_s"] <= result["lag_p99_s"] <= result["lag_max_s"] < 90
    assert len((LAGS_DIR / "peer-beat.txt").read_text().splitlines()) == 30


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_killed_benchmark_takes_its_processes_with_it(how):
    """Left behind, a bench's relay kept publishing the next run's envelopes (same database and queue names)."""
    database = f"{settings.DATABASES['default']['NAME']}_bench_killed_{how.lower()}"
    fresh_database(database)
    bench = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "bench", "burst", "--schedules", "50", "--tenants", "1", *TINY],
        env=deployment_env(database),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def started() -> bool:
            assert bench.poll() is None, bench.communicate()[0][-3000:]
            return len(_children(bench.pid)) >= 2

        wait_for(started, 120, "the bench to start its materializer and relay", every=0.2)
        children = _children(bench.pid)
        time.sleep(2)  # past their start-up, into their loops
        bench.send_signal(getattr(signal, how))
        output, _ = bench.communicate(timeout=60)
        wait_for(lambda: not any(_alive(pid) for pid in children), 30, f"no child left after {how} of the bench")
        if how == "SIGTERM":
            assert bench.returncode == 1
            assert "interrupted: the processes the run started were stopped" in output
            assert "Traceback" not in output
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        drop_database(database)
