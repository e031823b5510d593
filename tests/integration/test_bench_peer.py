"""`bench peer-beat`: validation and its refusals anywhere; with django-celery-beat, its rows, cleanup and a run."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from dispatch.bench.peer_beat import INSTALL_HINT, choose_t0, cpu_seconds, lag_summary, percentile

ROOT = Path(__file__).resolve().parents[2]
BEAT_INSTALLED = importlib.util.find_spec("django_celery_beat") is not None
needs_beat = pytest.mark.skipif(
    not BEAT_INSTALLED,
    reason=f"django-celery-beat is a benchmark-only dependency, not in requirements-dev.txt ({INSTALL_HINT})",
)


def bench(*args: str) -> str:
    out = StringIO()
    call_command("bench", "peer-beat", *args, stdout=out)
    return out.getvalue()


def run_under_bench_settings(code: str) -> dict:
    """Run a snippet under settings_bench on the test database (its models cannot load under the test settings);
    the snippet prints one JSON line last."""
    params = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings_bench",
        "DATABASE_URL": f"postgres://{params.get('USER') or 'postgres'}@{params.get('HOST') or '127.0.0.1'}:"
        f"{params.get('PORT') or 5432}/{params['NAME']}",
        "SCHEDULER_LOG_LEVEL": "WARNING",
    }
    prelude = "import django, json\ndjango.setup()\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- anywhere (CI has no django-celery-beat) ------------------------------------------------------------------


def test_t0_is_a_minute_boundary_far_enough_ahead_for_the_rows():
    now = datetime(2026, 3, 1, 10, 0, 39, 500000, tzinfo=UTC)
    assert choose_t0(now, 20) == datetime(2026, 3, 1, 10, 1, tzinfo=UTC)
    assert choose_t0(now, 10_000) == datetime(2026, 3, 1, 10, 2, tzinfo=UTC)  # 39.5 + 22 s passes 10:01
    assert choose_t0(datetime(2026, 3, 1, 23, 59, 50, tzinfo=UTC), 1) == datetime(2026, 3, 2, 0, 1, tzinfo=UTC)


def test_percentiles_interpolate_like_postgresql_percentile_cont():
    assert percentile([], 0.99) == 0.0
    assert percentile([4.0], 0.5) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([float(n) for n in range(101)], 0.99) == pytest.approx(99.0)


def test_lag_summary_has_the_burst_fields():
    summary = lag_summary([0.5, 0.1, 2.0, 1.0])
    assert summary["enqueued"] == 4
    assert summary["lag_max_s"] == 2.0
    assert summary["lag_min_s"] == 0.1
    assert summary["lag_p50_s"] == 0.75
    assert summary["dispatch_per_s"] == 2.0
    assert lag_summary([])["enqueued"] == 0


def test_cpu_seconds_reads_a_live_process_and_gives_none_for_a_gone_one():
    assert cpu_seconds(os.getpid()) >= 0
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert cpu_seconds(gone.pid) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks", "0"], "--tasks must be at least 1"),
        (["--tasks", "5", "--deadline", "0"], "--deadline must be a positive number"),
        (["--tasks", "5", "--deadline", "nan"], "--deadline must be a positive number"),
        (["--tasks", "5", "--lags-out", "/nonexistent-dir/lags.txt"], "does not exist"),
    ],
)
def test_peer_beat_rejects_bad_options_by_name(args, message):
    with pytest.raises(CommandError, match=message):
        bench(*args)


def test_peer_beat_rejects_a_directory_as_lags_file(tmp_path):
    with pytest.raises(CommandError, match="is a directory"):
        bench("--tasks", "5", "--lags-out", str(tmp_path))


def test_peer_beat_without_django_celery_beat_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr("dispatch.management.commands.bench.beat_installed", lambda: False)
    with pytest.raises(CommandError, match=re.escape(INSTALL_HINT)):
        bench("--tasks", "5")


def test_normal_settings_do_not_need_django_celery_beat():
    from django.conf import settings

    assert "django_celery_beat" not in settings.INSTALLED_APPS


# --- with django-celery-beat (requirements-bench.txt) ----------------------------------------------------------


@needs_beat
@pytest.mark.django_db(transaction=True)
def test_creates_due_rows_on_the_bench_queue_and_cleans_them_up():
    found = run_under_bench_settings(
        """
        from datetime import UTC, datetime
        from django_celery_beat.models import CrontabSchedule, PeriodicTask
        from dispatch.bench.peer_beat import PEER_QUEUE, PEER_TASK, PeerBeatBenchmark, PeerBeatConfig, choose_t0

        run = PeerBeatBenchmark(PeerBeatConfig(tasks=120), out=open("/dev/null", "w"))
        run.migrate()
        crontabs = CrontabSchedule.objects.count()
        t0 = choose_t0(datetime.now(UTC), 120)
        run.create_tasks(t0)
        rows = list(PeriodicTask.objects.filter(name__startswith="bench.peer-").select_related("crontab"))
        created = {
            "rows": len(rows),
            "names": len({r.name for r in rows}),
            "tasks": sorted({r.task for r in rows}) == [PEER_TASK],
            "queues": sorted({r.queue for r in rows}) == [PEER_QUEUE],
            "enabled": all(r.enabled for r in rows),
            "crontab": sorted({(r.crontab.minute, r.crontab.hour, str(r.crontab.timezone)) for r in rows}),
            "expected": [(str(t0.minute), str(t0.hour), "UTC")],
        }
        run.cleanup()
        left = PeriodicTask.objects.filter(name__startswith="bench.peer-").count()
        print(json.dumps({**created, "left": left, "crontabs_left": CrontabSchedule.objects.count() - crontabs}))
        """
    )
    assert found["rows"] == found["names"] == 120
    assert found["tasks"] and found["queues"] and found["enabled"]
    assert [tuple(c) for c in found["crontab"]] == [tuple(c) for c in found["expected"]]
    assert found["left"] == 0
    assert found["crontabs_left"] == 0


@needs_beat
@pytest.mark.django_db(transaction=True)
def test_refuses_a_database_with_periodic_tasks_of_its_own():
    """Beat fires every enabled row: the bench must not start one where real periodic tasks live. This goes
    through the re-executed child, so its refusal must reach the caller as a failed command."""
    run_under_bench_settings(
        """
        from dispatch.bench.peer_beat import PeerBeatBenchmark, PeerBeatConfig
        PeerBeatBenchmark(PeerBeatConfig(tasks=1)).migrate()
        from django_celery_beat.models import IntervalSchedule, PeriodicTask
        every, _ = IntervalSchedule.objects.get_or_create(every=1, period="days")
        PeriodicTask.objects.create(name="real nightly report", task="reports.nightly", interval=every)
        print(json.dumps({}))
        """
    )
    try:
        with pytest.raises(CommandError) as refused:
            bench("--tasks", "5", "--deadline", "5")
        assert refused.value.returncode == 1
    finally:
        run_under_bench_settings(
            """
            from django_celery_beat.models import PeriodicTask
            PeriodicTask.objects.filter(name="real nightly report").delete()
            print(json.dumps({}))
            """
        )
