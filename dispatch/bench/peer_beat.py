"""The peer benchmark: N tasks due at one minute boundary under django-celery-beat, lag measured like ours.

1. Refuse without django-celery-beat (requirements-bench.txt). Run under `scheduler_project.settings_bench`, which
   adds it to the installed apps: a caller on the normal settings re-executes the command under them. Migrate
   beat's tables into the public schema.
2. Create one CrontabSchedule (minute M, hour H, UTC) for the next minute boundary T0 at least 20 s + N/5000 s
   ahead, and N PeriodicTask rows (bulk_create, unique names, task `bench.peer_noop`, which never runs) routed
   to the durable queue `bench.<database>.peer`.
3. Start a consumer of that queue in this process, then `celery -A scheduler_project beat -S
   django_celery_beat.schedulers:DatabaseScheduler` with publisher confirms on (settings_bench). Beat loads the
   rows at start. Its DatabaseScheduler sleeps at most `max_interval` = 5 s (DEFAULT_MAX_INTERVAL, as
   `beat_max_loop_interval` is unset), but never past the heap's next due time, so it wakes at T0 itself;
   `beat_sync_every` is unset, so it writes `last_run_at` back every 180 s and at exit. Beat publishes one due
   entry per tick, and every tick queries PeriodicTasks.last_change and compares the whole schedule with the
   previous one (Scheduler.schedules_equal): one publish costs O(N), the burst O(N^2).
4. Lag = arrival time at the consumer (time.time() on this box) - T0, for the first message of each task. Our
   burst stamps the broker's publisher confirm, a hair before such an arrival, so this comparison does not
   favour us. Count messages, distinct task names and ids; lost = N - distinct names. Stop when every task has
   arrived or `deadline` seconds after T0. Beat's peak RSS comes from /proc (VmHWM). `--lags-out` gets one lag
   per message, in arrival order.
5. Stop beat, delete the rows it was given (and the default entry it created itself), delete the queue.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import OutputWrapper
from django.db import connection
from kombu import Connection as BrokerConnection
from kombu import Consumer, Exchange, Queue
from tqdm import tqdm

from dispatch.bench.processes import PROJECT_ROOT, database_url, rss_peak_mb, start_child

# Named after the database, as the other benchmarks' queues are: runs on two databases never share a queue.
PEER_QUEUE = f"bench.{settings.DATABASES['default']['NAME']}.peer"
PEER_TASK = "bench.peer_noop"
PEER_NAME_PREFIX = "bench.peer-"
BENCH_SETTINGS = "scheduler_project.settings_bench"
BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
INSTALL_HINT = "pip install -r requirements-bench.txt"
# Beat installs this entry itself at start (result_expires is set); it is not the bench's, but a run leaves none.
BEAT_DEFAULT_ENTRY = "celery.backend_cleanup"
# One peer run per database at a time: its queue and its left-over cleanup are the database's.
ADVISORY_LOCK_KEY = 0x62656E6368  # "bench"
# Marks the re-executed child, so a settings module that lacks the app fails instead of looping.
REEXEC_ENV = "SCHEDULER_BENCH_PEER_CHILD"
BULK_BATCH = 5000
BEAT_LOG_COMPLAINT = re.compile(r"(?<![%\w])(WARNING|ERROR|CRITICAL)\b|Traceback")


class PeerRefused(Exception):
    """The peer benchmark cannot run here; the message says what to do instead."""


@dataclass
class PeerBeatConfig:
    tasks: int
    deadline_seconds: float = 600.0
    lags_out: Path | None = None


def beat_installed() -> bool:
    return importlib.util.find_spec("django_celery_beat") is not None


def beat_in_settings() -> bool:
    return "django_celery_beat" in settings.INSTALLED_APPS


def choose_t0(now: datetime, tasks: int) -> datetime:
    """The next minute boundary at least 20 s + N/5000 s after `now`: time to create the rows and let beat load
    them before the instant, as the burst benchmark leaves its materializer."""
    earliest = now + timedelta(seconds=20 + tasks / 5000)
    return (earliest + timedelta(minutes=1)).replace(second=0, microsecond=0)


def percentile(ordered: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks: PostgreSQL's percentile_cont, which the burst benchmark uses."""
    if not ordered:
        return 0.0
    position = fraction * (len(ordered) - 1)
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def lag_summary(lags: list[float]) -> dict[str, float | int]:
    """The burst benchmark's lag fields, from one lag per delivered task."""
    ordered = sorted(lags)
    enqueued = len(ordered)
    lag_max = ordered[-1] if ordered else 0.0
    return {
        "enqueued": enqueued,
        "lag_p50_s": round(percentile(ordered, 0.5), 3),
        "lag_p95_s": round(percentile(ordered, 0.95), 3),
        "lag_p99_s": round(percentile(ordered, 0.99), 3),
        "lag_max_s": round(lag_max, 3),
        "lag_min_s": round(ordered[0], 3) if ordered else 0.0,
        "dispatch_per_s": round(enqueued / max(lag_max, 1e-3), 1),
    }


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far, from /proc: set against the wall time it took, it tells a
    CPU-bound run on an idle box from one that waited for another engineer's benchmark."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # Fields 14 and 15 of stat(5) (utime, stime), counted here from field 3, the first after the command name.
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)


def write_lags(path: Path, lags: list[float]) -> None:
    path.write_text("".join(f"{lag:.6f}\n" for lag in lags))


def peer_queue() -> Queue:
    """The peer queue exactly as Celery declares a queue it creates on demand (an exchange of the same name, direct,
    durable): RabbitMQ refuses a redeclaration with other flags, and beat declares it on its first publish."""
    return Queue(PEER_QUEUE, Exchange(PEER_QUEUE, type="direct", durable=True), routing_key=PEER_QUEUE, durable=True)


def child_command(config: PeerBeatConfig) -> list[str]:
    command = [
        sys.executable,
        str(PROJECT_ROOT / "manage.py"),
        "bench",
        "peer-beat",
        "--tasks",
        str(config.tasks),
        "--deadline",
        str(config.deadline_seconds),
    ]
    if config.lags_out is not None:
        command += ["--lags-out", str(config.lags_out.resolve())]
    return command


def run_under_bench_settings(config: PeerBeatConfig, out: IO[str] | OutputWrapper) -> int:
    """Re-execute `bench peer-beat` under settings_bench on the same database, forwarding its output; returns its
    exit code. The product's settings never load django-celery-beat, so its models are only usable there."""
    if os.environ.get(REEXEC_ENV):
        raise PeerRefused(f"{BENCH_SETTINGS} did not add django_celery_beat to INSTALLED_APPS; nothing to run.")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": BENCH_SETTINGS,
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        REEXEC_ENV: "1",
    }
    # A session of its own: a terminal's Ctrl-C reaches only this process, which passes it on exactly once (a
    # second SIGINT would cut short the child's cleanup). Beat, the child's child, shares the child's group.
    child = start_child(
        child_command(config),
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    try:
        _forward(child, out)
        return child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        _forward(child, out)  # while it stops beat and deletes its rows; it closes the pipe when it exits
        child.wait()
        raise
    finally:
        if child.poll() is None:  # any other failure, or a second Ctrl-C: leave neither it nor its beat running
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _forward(child: subprocess.Popen, out: IO[str] | OutputWrapper) -> None:
    assert child.stdout is not None
    for line in child.stdout:
        # Lines arrive with their own newline; Django's OutputWrapper would add another.
        if isinstance(out, OutputWrapper):
            out.write(line, ending="")
        else:
            out.write(line)
        out.flush()


class PeerBeatBenchmark:
    def __init__(self, config: PeerBeatConfig, out: IO[str] | OutputWrapper = sys.stdout) -> None:
        self.config = config
        self.out = out
        self.run_id = uuid.uuid4().hex[:8]
        self.crontabs_before: set[int] | None = None
        self.default_entry_existed = True
        self.beat: subprocess.Popen | None = None
        self.beat_log: Path | None = None
        self.kept_log: str | None = None
        self.beat_cpu_s: float | None = None
        self.arrivals: list[tuple[float, str, str]] = []  # (arrival time, periodic task name, message id)
        self.first_arrival: dict[str, float] = {}
        self.foreign_messages = 0  # on the bench queue but not from this run's rows: reported, never counted

    def say(self, message: str) -> None:
        self.out.write(message + "\n")
        self.out.flush()

    # --- setup -------------------------------------------------------------------------------------------------

    def migrate(self) -> None:
        """Beat's tables in the public schema only: it is a shared app, and tenant schemas never need them."""
        call_command("migrate_schemas", "django_celery_beat", shared=True, verbosity=0, stdout=io.StringIO())

    def lock(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_LOCK_KEY])
            if not cursor.fetchone()[0]:
                raise PeerRefused("another `bench peer-beat` is running on this database; wait for it to finish.")

    def unlock(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_LOCK_KEY])

    def check_quiet(self) -> None:
        """Refuse where beat would fire real periodic tasks: it runs every enabled row in the database."""
        from django_celery_beat.models import PeriodicTask

        others = (
            PeriodicTask.objects.filter(enabled=True)
            .exclude(name__startswith=PEER_NAME_PREFIX)
            .exclude(name=BEAT_DEFAULT_ENTRY)
            .count()
        )
        if others:
            raise PeerRefused(
                f"bench peer-beat starts a beat that fires every enabled periodic task in the database, and {others} "
                "are not the bench's. Run it against a database of its own (createdb, then "
                "DATABASE_URL=... manage.py migrate, then the bench)."
            )

    def cleanup(self) -> None:
        """Remove the bench's rows and queue (also left-overs of an interrupted run: the lock says none is live)."""
        from django_celery_beat.models import CrontabSchedule, PeriodicTask, PeriodicTasks

        # Plain SQL: a queryset delete() sends beat's change signal per row, 10,000 upserts in one transaction.
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {PeriodicTask._meta.db_table} WHERE starts_with(name, %s) OR (name = %s AND %s)",
                [PEER_NAME_PREFIX, BEAT_DEFAULT_ENTRY, not self.default_entry_existed],
            )
        if self.crontabs_before is not None:
            # Ours and the one beat made for its default entry; a crontab that was there before stays.
            CrontabSchedule.objects.exclude(id__in=self.crontabs_before).filter(periodictask__isnull=True).delete()
        # Queryset deletes skip the model's change signal; a live beat elsewhere should still see the change.
        PeriodicTasks.update_changed()
        with BrokerConnection(settings.CELERY_BROKER_URL) as broker:
            channel = broker.channel()
            for delete in (channel.queue_delete, channel.exchange_delete):
                try:
                    delete(PEER_QUEUE)
                except Exception:  # absent already: the channel is closed by the error, open another
                    channel = broker.channel()

    def create_tasks(self, t0: datetime) -> None:
        """One crontab row for T0 and N periodic tasks on it, bulk-created (N admin saves would take minutes)."""
        from django_celery_beat.models import CrontabSchedule, PeriodicTask, PeriodicTasks

        self.default_entry_existed = PeriodicTask.objects.filter(name=BEAT_DEFAULT_ENTRY).exists()
        self.crontabs_before = set(CrontabSchedule.objects.values_list("id", flat=True))
        crontab, _ = CrontabSchedule.objects.get_or_create(
            minute=str(t0.minute),
            hour=str(t0.hour),
            day_of_week="*",
            day_of_month="*",
            month_of_year="*",
            timezone="UTC",
        )
        total = self.config.tasks
        with tqdm(total=total, desc="create tasks", unit="task", file=self.out, mininterval=2) as bar:
            for start in range(0, total, BULK_BATCH):
                rows = [
                    PeriodicTask(
                        name=f"{PEER_NAME_PREFIX}{self.run_id}-{n}",
                        task=PEER_TASK,
                        crontab=crontab,
                        queue=PEER_QUEUE,
                        description="bench peer-beat",
                    )
                    for n in range(start, min(start + BULK_BATCH, total))
                ]
                PeriodicTask.objects.bulk_create(rows)
                bar.update(len(rows))
        # bulk_create skips the model's change signal; beat starts after this anyway and reads every row.
        PeriodicTasks.update_changed()

    # --- beat --------------------------------------------------------------------------------------------------

    def start_beat(self) -> None:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": BENCH_SETTINGS,
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "SCHEDULER_LOG_LEVEL": "WARNING",
        }
        handle, name = tempfile.mkstemp(prefix="bench-peer-beat-", suffix=".log")
        self.beat_log = Path(name)
        command = [sys.executable, "-m", "celery", "-A", "scheduler_project", "beat", "-S", BEAT_SCHEDULER]
        command += ["--loglevel", "WARNING"]
        with os.fdopen(handle, "w") as log:
            self.beat = start_child(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop_beat(self) -> float | None:
        """Beat's peak RSS and CPU time, then SIGTERM (beat writes its dirty rows back on exit, no longer needed)."""
        if self.beat is None:
            return None
        peak = rss_peak_mb(self.beat.pid)
        self.beat_cpu_s = cpu_seconds(self.beat.pid)
        if self.beat.poll() is None:
            self.beat.send_signal(signal.SIGTERM)
            try:
                self.beat.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.beat.kill()
                self.beat.wait()
        return peak

    def keep_beat_log(self) -> str | None:
        """The log's path if beat said more than its start banner (a warning or an error), else remove it."""
        if self.beat_log is None or not self.beat_log.exists():
            return None
        # The banner names the log level as "@%WARNING"; a logged record has the level as a word of its own.
        if BEAT_LOG_COMPLAINT.search(self.beat_log.read_text()):
            return str(self.beat_log)
        self.beat_log.unlink()
        return None

    def check_beat_alive(self) -> None:
        if self.beat is not None and self.beat.poll() is not None:
            tail = self.beat_log.read_text()[-2000:] if self.beat_log and self.beat_log.exists() else ""
            raise RuntimeError(f"celery beat exited with code {self.beat.returncode}:\n{tail}")

    # --- measurement -------------------------------------------------------------------------------------------

    def on_message(self, message: Any) -> None:
        arrived = time.time()  # first: the stamp must not include our own bookkeeping
        headers = message.headers or {}
        name = headers.get("periodic_task_name") or ""
        if not name.startswith(f"{PEER_NAME_PREFIX}{self.run_id}-"):
            self.foreign_messages += 1
            return
        self.arrivals.append((arrived, name, headers.get("id") or ""))
        self.first_arrival.setdefault(name, arrived)

    def consume_until_done(self, broker: BrokerConnection, t0: datetime) -> bool:
        """Drain the queue until every task has arrived (True) or the deadline after T0 has passed (False)."""
        total = self.config.tasks
        deadline = t0.timestamp() + self.config.deadline_seconds
        with tqdm(total=total, desc="arrived from beat", unit="task", file=self.out, mininterval=2) as bar:
            while len(self.first_arrival) < total:
                remaining = deadline - time.time()
                if remaining <= 0:
                    return False
                with contextlib.suppress(socket.timeout, TimeoutError):
                    broker.drain_events(timeout=min(1.0, remaining))
                bar.update(len(self.first_arrival) - bar.n)
                self.check_beat_alive()
            bar.update(len(self.first_arrival) - bar.n)
        return True

    # --- run ---------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        config = self.config
        self.say(
            f"bench peer-beat: {config.tasks} django-celery-beat tasks due at one minute boundary, "
            f"deadline {config.deadline_seconds:.0f} s after it"
        )
        self.migrate()
        self.lock()
        peak_rss, finished, lead = None, False, 0.0
        try:
            self.check_quiet()
            self.cleanup()
            started = time.monotonic()
            t0 = choose_t0(datetime.now(UTC), config.tasks)
            self.create_tasks(t0)
            setup_s = time.monotonic() - started
            with BrokerConnection(settings.CELERY_BROKER_URL) as broker:
                channel = broker.channel()
                queue = peer_queue()(channel)
                queue.declare()
                # no_ack: the broker pushes each message as soon as it is routed, the arrival we stamp.
                with Consumer(channel, queues=[queue], on_message=self.on_message, no_ack=True):
                    self.start_beat()
                    lead = t0.timestamp() - time.time()
                    self.say(
                        f"T0 = {t0.isoformat()} (in {lead:.0f} s); setup took {setup_s:.1f} s; beat log {self.beat_log}"
                    )
                    try:
                        finished = self.consume_until_done(broker, t0)
                    finally:
                        peak_rss = self.stop_beat()
                        self.kept_log = self.keep_beat_log()
        finally:
            try:
                self.cleanup()
            finally:
                self.unlock()
        return self.result(t0, finished, peak_rss, lead)

    def result(self, t0: datetime, finished: bool, peak_rss: float | None, lead: float) -> dict[str, Any]:
        base = t0.timestamp()
        first = sorted(self.first_arrival.values())
        stats = lag_summary([arrived - base for arrived in first])
        messages = len(self.arrivals)
        names = {name for _, name, _ in self.arrivals}
        ids = {message_id for _, _, message_id in self.arrivals}
        if self.config.lags_out is not None:
            write_lags(self.config.lags_out, [arrived - base for arrived, _, _ in self.arrivals])
        return {
            "peer": f"django-celery-beat {importlib.metadata.version('django-celery-beat')} DatabaseScheduler",
            "tasks": self.config.tasks,
            **stats,
            "lost": self.config.tasks - len(names),
            "duplicates": messages - len(names),
            "duplicate_ids": messages - len(ids),
            "messages": messages,
            "foreign_messages": self.foreign_messages,
            "finished": finished,
            "deadline_s": self.config.deadline_seconds,
            "t0": t0.isoformat(),
            "beat_started_before_t0_s": round(lead, 1),
            "peak_rss_mb": peak_rss,
            "beat_cpu_s": self.beat_cpu_s,
            "loadavg_1m_at_end": float(Path("/proc/loadavg").read_text().split()[0]),
            "celery": importlib.metadata.version("celery"),
            "confirm_publish": bool(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}).get("confirm_publish")),
            "cpu_count": os.cpu_count(),
            "beat_log": self.kept_log,
            "lags_out": str(self.config.lags_out) if self.config.lags_out is not None else None,
        }
