"""The top-of-hour burst benchmark: N strict (or flexible) fires due at one instant, through the real processes.

1. Provision T bench tenants and COPY N schedules (plus K idle ones) due at one minute boundary T0.
2. Start M `materialize` and R `relay` processes (own queues, so no real work is touched).
3. Wait until every fire's envelope is confirmed by the broker (or a deadline), showing progress.
4. Measure lag = broker confirmation stamp - scheduled_for per occurrence, lost and duplicate fires, peak RSS.
5. Clean up tenants, rows and queues, so it can run again.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from kombu import Connection as BrokerConnection
from tqdm import tqdm

from core.clock import db_now
from dispatch.bench.faults import Fault, through_failover
from dispatch.bench.measure import BurstMeasurements
from dispatch.bench.processes import PROJECT_ROOT, children_rss_peak_mb, database_url, start_child
from dispatch.bench.rows import (
    BENCH_FLEXIBLE_QUEUE,
    BENCH_STRICT_QUEUE,
    BENCH_TENANT_PREFIX,
    PLANNING,
    SCHEDULE_COLUMNS,
    UNTHROTTLED,
    BenchRefused,
    name_holiday_calendars,
    schedule_row,
)
from dispatch.queues import with_crowds
from tenants.models import Tenant
from tenants.services import provision_tenant

logger = logging.getLogger(__name__)


@dataclass
class BurstConfig:
    schedules: int
    tenants: int = 1
    lane: str = "strict"
    materializers: int = 1
    relays: int = 1
    idle: int = 0
    flexible_window_seconds: int = 300
    deadline_seconds: float = 120.0
    keep: bool = False
    # Leave the idle schedules in place after the run and reuse them in the next one: 20 M of them take longer to
    # load than the run they are stored for, and consecutive runs over one stored table are the honest comparison.
    keep_idle: bool = False
    lags_out: str | None = None
    queue_type: str = "classic"  # classic or quorum (SCHEDULER_QUEUE_TYPE of the processes)
    # The materializers' horizon; None: the deployment's SCHEDULER_HORIZON_SECONDS, so the run shows what a
    # deployment gets (the burst enters the horizon that long before T0 and must be written before it).
    horizon_seconds: float | None = None
    # Dates of a holiday calendar each tenant gets and every due schedule names (0: none), from the day after T0.
    calendar_dates: int = 0
    # A shell command that strikes at T0, beside the run: a node lost mid-burst (dispatch/bench/faults.py).
    fault: str | None = None


class BurstBenchmark(BurstMeasurements):
    queues = with_crowds(BENCH_STRICT_QUEUE, BENCH_FLEXIBLE_QUEUE)
    # The handler of the bench schedules; the burst never runs it (no workers), the drain does.
    handler = "noop"

    def __init__(self, config: BurstConfig, out=sys.stdout) -> None:
        self.config = config
        self.out = out
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.tenant_ids: list[int] = []
        self.materialize_rate: float | None = None
        # Filled as the run goes: fires per envelope (read once, after materialization), the confirmed envelopes.
        self.fires_by_envelope: dict[int, int] = {}
        self.confirmed_envelopes: set[int] = set()
        self.unpublished = -1

    def say(self, message: str) -> None:
        self.out.write(message + "\n")
        self.out.flush()

    # --- setup -------------------------------------------------------------------------------------------------

    def cleanup(self, *, keep_idle: bool | None = None) -> None:
        """Remove every bench tenant, its rows and the bench queues (also left-overs of an interrupted run); with
        `keep_idle` (by default the run's --keep-idle), the idle schedules and their tenants stay for the next run."""
        keep_idle = self.config.keep_idle if keep_idle is None else keep_idle
        bench = list(Tenant.objects.filter(slug__startswith=BENCH_TENANT_PREFIX))
        ids = [t.id for t in bench]
        if ids:
            with connection.cursor() as cursor:
                # The schedules this cleanup removes: all of the bench tenants', or all but the idle ones.
                cursor.execute("DROP TABLE IF EXISTS bench_removed")
                cursor.execute(
                    "CREATE TEMP TABLE bench_removed AS SELECT id FROM schedules_schedule"
                    " WHERE tenant_id = ANY(%s) AND NOT (%s AND name LIKE 'bench-idle-%%')",
                    [ids, keep_idle],
                )
                cursor.execute("ANALYZE bench_removed")
                cursor.execute("DELETE FROM dispatch_outboxmessage WHERE tenant_id = ANY(%s)", [ids])
                cursor.execute(
                    "DELETE FROM dispatch_attempt WHERE occurrence_id IN"
                    " (SELECT occurrence_id FROM dispatch_occurrence WHERE tenant_id = ANY(%s))",
                    [ids],
                )
                cursor.execute("DELETE FROM dispatch_occurrence WHERE tenant_id = ANY(%s)", [ids])
                cursor.execute(
                    "DELETE FROM schedules_scheduleversion WHERE schedule_id IN (SELECT id FROM bench_removed)"
                )
                # Each deleted schedule fires a foreign-key check against the version table. Right after a mass
                # delete that table is full of dead rows and its statistics are stale, and the check's plan can
                # become a sequential scan per row: measured at 500,000 rows, over a quarter of an hour. A
                # VACUUM ANALYZE first keeps every check an index probe.
                cursor.execute("VACUUM ANALYZE schedules_scheduleversion")
                cursor.execute(
                    "DELETE FROM schedules_schedulecursor WHERE schedule_id IN (SELECT id FROM bench_removed)"
                )
                cursor.execute("DELETE FROM schedules_schedule WHERE id IN (SELECT id FROM bench_removed)")
                cursor.execute("DROP TABLE bench_removed")
                # The next run must not pay for this one's dead rows: every cursor advance of a run leaves one in
                # the schedule table and its due index, and a server without autovacuum (or one that has not run
                # yet) would make the next run's due scans walk them all (measured: 3.1 M dead rows after a dozen
                # runs made one batch's scan take over a second).
                for table in ("schedules_schedule", "schedules_schedulecursor", "dispatch_outboxmessage"):
                    cursor.execute(f"VACUUM ANALYZE {table}")
                cursor.execute("VACUUM ANALYZE dispatch_occurrence")
            if not keep_idle:
                self.delete_tenants(bench)
        with BrokerConnection(settings.CELERY_BROKER_URL) as broker:
            channel = broker.channel()
            for queue in with_crowds(BENCH_STRICT_QUEUE, BENCH_FLEXIBLE_QUEUE):
                try:
                    channel.queue_delete(queue)
                except Exception:
                    channel = broker.channel()

    def delete_tenants(self, tenants: list[Tenant]) -> None:
        """The bench tenants, their rows already gone: each through the one deletion path (tenants.services)."""
        for tenant in tenants:
            tenant.delete(force_drop=True)

    def check_quiet(self) -> None:
        """Refuse to run where real work would be touched: the bench's materializer and relay process every
        tenant, so other tenants' fires during the run would be published to the bench queues and dropped."""
        horizon_end = db_now() + timedelta(seconds=600 + self.config.deadline_seconds)
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT count(*) FROM schedules_schedulecursor c JOIN tenants_tenant t ON t.id = c.tenant_id
                WHERE c.next_run_at <= %s AND t.slug NOT LIKE %s
                """,
                [horizon_end, BENCH_TENANT_PREFIX + "%"],
            )
            due_elsewhere = cursor.fetchone()[0]
            cursor.execute(
                "SELECT count(*) FROM dispatch_outboxmessage m JOIN tenants_tenant t ON t.id = m.tenant_id"
                " WHERE m.published_at IS NULL AND t.slug NOT LIKE %s",
                [BENCH_TENANT_PREFIX + "%"],
            )
            due_elsewhere += cursor.fetchone()[0]
            cursor.execute(
                "SELECT count(*) FROM dispatch_processheartbeat"
                " WHERE heartbeat_at > clock_timestamp() - interval '60 s' AND name NOT LIKE 'bench-%%'"
            )
            live = cursor.fetchone()[0]
        if due_elsewhere or live:
            raise BenchRefused(
                f"bench burst needs a quiet database: {due_elsewhere} schedules or envelopes of other tenants fall due "
                f"during the run and {live} platform processes are live. Run it against a database of its own "
                "(DATABASE_URL=... manage.py migrate, then the bench), or stop the processes and pause those schedules."
            )

    def provision(self) -> list[Tenant]:
        tenants = []
        for n in range(self.config.tenants):
            slug = f"{BENCH_TENANT_PREFIX}{n + 1}"
            # Quotas out of the way: the burst measures the platform's dispatch, not a tenant's throttle.
            provisioned = provision_tenant(slug, domain=f"{slug}.localhost", **UNTHROTTLED)
            tenants.append(provisioned.tenant)
        self.tenant_ids = [t.id for t in tenants]
        return tenants

    @property
    def horizon(self) -> float:
        return self.config.horizon_seconds or settings.SCHEDULER_HORIZON_SECONDS

    def choose_t0(self) -> datetime:
        """The next minute boundary at least a horizon (and the processes' start-up) ahead: the due schedules enter
        the horizon at T0 - horizon, as in a deployment, and the materializers have exactly that long."""
        # The due rows are written after T0 is chosen: their setup (about 15,000 schedules a second here) is
        # added, so the processes start with the whole horizon ahead of them.
        earliest = db_now() + timedelta(seconds=self.horizon + 15 + self.config.schedules / 15_000)
        return (earliest + timedelta(minutes=1)).replace(second=0, microsecond=0)

    def copy_schedules(self, tenants: list[Tenant], count: int, fire_at: datetime, *, due: bool) -> None:
        """COPY `count` schedules whose next fire is `fire_at`: N API calls would take an hour. Due ones fire
        daily at that minute in the benchmark's lane; idle ones yearly, far ahead, and never fall due."""
        cron = (
            f"{fire_at.minute} {fire_at.hour} * * *"
            if due
            else f"{fire_at.minute} {fire_at.hour} {fire_at.day} {fire_at.month} *"
        )
        now = db_now()
        total = count
        label = "create due schedules" if due else "create idle schedules"
        with (
            connection.cursor() as wrapper,
            tqdm(total=total, desc=label, unit="sch", file=self.out, mininterval=2) as bar,
        ):
            cursor = wrapper.cursor
            with cursor.copy(f"COPY schedules_schedule ({SCHEDULE_COLUMNS}) FROM STDIN") as copy:
                for n in range(total):
                    copy.write_row(
                        schedule_row(
                            uuid.uuid4(),
                            tenants[n % len(tenants)].id,
                            f"bench-{'due' if due else 'idle'}-{n}",
                            handler=self.handler,
                            now=now,
                            cron=cron,
                            lane=self.config.lane if due else "strict",
                            flexible_window_seconds=self.config.flexible_window_seconds,
                        )
                    )
                    if n % 10000 == 0:
                        bar.update(min(10000, total - bar.n))
            if due and self.config.calendar_dates:
                first = fire_at.date() + timedelta(days=1)
                name_holiday_calendars(wrapper, [t.id for t in tenants], first, self.config.calendar_dates)
            # Their cursors, as Schedule.save() would have written them, in one statement: the schedules of exactly
            # the tenants just written (a subclass calls this once per tenant; another tenant's cursors exist).
            wrapper.execute(
                f"""
                INSERT INTO schedules_schedulecursor (schedule_id, tenant_id, shard, version, next_run_at, {PLANNING})
                SELECT id, tenant_id, shard, version, %s, {PLANNING} FROM schedules_schedule
                WHERE tenant_id = ANY(%s) AND name LIKE %s
                """,
                [fire_at, [t.id for t in tenants], "bench-due-%" if due else "bench-idle-%"],
            )
            bar.update(total - bar.n)

    def stored_idle(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM schedules_schedule WHERE tenant_id = ANY(%s) AND name LIKE 'bench-idle-%%'",
                [self.tenant_ids],
            )
            return cursor.fetchone()[0]

    def load_idle(self, tenants: list[Tenant]) -> float | None:
        """Store the idle schedules, or reuse an earlier run's (--keep-idle) when they are as many as asked for;
        returns the seconds the load took (None when reused)."""
        count = self.config.idle
        stored = self.stored_idle() if self.config.keep_idle else 0
        if stored == count:
            if count:
                self.say(f"reusing the {stored} idle schedules an earlier run kept")
            return None
        if stored:
            self.say(f"{stored} idle schedules stored, {count} asked for: reloading them")
            self.cleanup(keep_idle=False)
            tenants[:] = self.provision()
        started = time.monotonic()
        idle_at = (db_now() + timedelta(days=180)).replace(second=0, microsecond=0)
        self.copy_schedules(tenants, count, idle_at, due=False)
        self.write_first_versions(due=False)
        return round(time.monotonic() - started, 1)

    # --- processes ---------------------------------------------------------------------------------------------

    def write_first_versions(self, *, due: bool) -> None:
        """Version 1 of the due (or idle) bench schedules, as the API would have written it (for reconcile)."""
        now = db_now()
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO schedules_scheduleversion (schedule_id, tenant_id, version, change, definition, valid_from,
                                                       actor)
                SELECT id, tenant_id, 1, 'create',
                       jsonb_build_object('name', name, 'kind', kind, 'cron', cron, 'run_at', NULL,
                                          'timezone', timezone, 'lane', lane, 'state', state, 'handler', handler),
                       %s, 'bench'
                FROM schedules_schedule WHERE tenant_id = ANY(%s) AND name LIKE %s
                """,
                [now, self.tenant_ids, "bench-due-%" if due else "bench-idle-%"],
            )
            # Rows a deployment's schedules have long had: statistics, hint bits and an all-visible map, which
            # autovacuum gives them in the hours after they are written. Freshly COPYed rows have none of it, and
            # the materializer's first reads (and the bench's own progress count) would pay for setting them.
            cursor.execute("VACUUM ANALYZE schedules_schedule")
            cursor.execute("VACUUM ANALYZE schedules_schedulecursor")
            cursor.execute("VACUUM ANALYZE schedules_scheduleversion")

    def flush_setup(self) -> None:
        """Write the setup's dirty pages out before the processes start (needs a superuser or pg_checkpoint): the
        materializer must not pay for flushing the bench's own bulk load, nor start its run with the WAL the load
        left, which brought a WAL-triggered checkpoint (and a second round of full-page writes) into the run."""
        try:
            with connection.cursor() as cursor:
                cursor.execute("CHECKPOINT")
        except DatabaseError as exc:
            self.say(f"no CHECKPOINT after setup ({str(exc).strip()}): the run may pay for the setup's writes")

    def process_env(self, horizon: float) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "SCHEDULER_STRICT_QUEUE": BENCH_STRICT_QUEUE,
                "SCHEDULER_FLEXIBLE_QUEUE": BENCH_FLEXIBLE_QUEUE,
                "SCHEDULER_HORIZON_SECONDS": str(horizon),
                "SCHEDULER_QUEUE_TYPE": self.config.queue_type,
                # The processes' own log lines, when a run needs explaining (SCHEDULER_BENCH_LOG_LEVEL=DEBUG).
                "SCHEDULER_LOG_LEVEL": os.environ.get("SCHEDULER_BENCH_LOG_LEVEL", "WARNING"),
                "DATABASE_URL": database_url(),
            }
        )
        return env

    def start_processes(self, horizon: float) -> None:
        env = self.process_env(horizon)
        manage = [sys.executable, str(PROJECT_ROOT / "manage.py")]
        for n in range(self.config.materializers):
            self.processes.append(
                (
                    f"materializer-{n + 1}",
                    start_child([*manage, "materialize", "--name", f"bench-materializer-{n + 1}"], env=env),
                )
            )
        for n in range(self.config.relays):
            self.processes.append(
                (
                    f"relay-{n + 1}",
                    start_child([*manage, "relay", "--name", f"bench-relay-{n + 1}"], env=env),
                )
            )

    def stop_processes(self) -> dict[str, float | None]:
        peaks = {name: children_rss_peak_mb(proc.pid) for name, proc in self.processes}
        for _, proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in self.processes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        return peaks

    # --- run ---------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        config = self.config
        self.say(
            f"bench burst: {config.schedules} {config.lane} schedules, {config.tenants} tenants, "
            f"{config.idle} idle, {config.materializers} materializers, {config.relays} relays"
        )
        self.check_quiet()
        self.cleanup()
        started = time.monotonic()
        tenants = self.provision()
        idle_load_s = self.load_idle(tenants)
        # T0 is chosen after the idle rows exist, so however long they took, the due ones have their lead.
        t0 = self.choose_t0()
        self.copy_schedules(tenants, config.schedules, t0, due=True)
        self.write_first_versions(due=True)
        self.flush_setup()
        setup_s = time.monotonic() - started
        self.say(
            f"T0 = {t0.isoformat()} (in {(t0 - db_now()).total_seconds():.0f} s, horizon {self.horizon:.0f} s); "
            f"setup took {setup_s:.1f} s"
        )
        inserted_before = self.occurrences_inserted()
        self.start_processes(self.horizon)
        peaks: dict[str, float | None] = {}
        fault = Fault(config.fault) if config.fault else None
        try:
            materialized_at = self._wait_materialized(t0, inserted_before)
            if fault is not None:
                fault.start_before(t0, self.say)
            confirmed = self._wait_confirmed(t0)
            if config.lane == "flexible":
                time.sleep(1)
            after = self.after_confirmed(t0)
        finally:
            peaks = self.stop_processes()
        # The fault is over before the queues are read back (a paused node answers only once it is resumed).
        fault_result = fault.finish() if fault is not None else None
        stats = self.lag_stats("scheduled_for")
        if config.lags_out:
            self.write_lags(config.lags_out)
        audit = self.audit_queues()
        result: dict[str, Any] = {
            "schedules": config.schedules,
            "tenants": config.tenants,
            "lane": config.lane,
            "idle": config.idle,
            "materializers": config.materializers,
            "relays": config.relays,
            "queue_type": config.queue_type,
            "calendar_dates": config.calendar_dates,
            "horizon_s": self.horizon,
            **stats,
            "lost": config.schedules - stats["enqueued"],
            "lost_on_broker": config.schedules - audit["occurrences"],
            "duplicates": self.duplicate_count() + audit["duplicate_messages"],
            "broker_messages": audit["messages"],
            "dispatch_per_s": round(stats["enqueued"] / max(stats["lag_max_s"], 1e-3), 1),
            "materialized_before_t0_s": materialized_at,
            "materialize_per_s": self.materialize_rate,
            # Settling removes confirmed envelopes from the outbox as it goes: the stamps are the full count.
            "confirmed": max(confirmed, stats["enqueued"]),
            "peak_rss_mb": peaks,
            "envelope_size": settings.SCHEDULER_ENVELOPE_SIZE,
            "setup_s": round(setup_s, 1),
            # None: the idle schedules of an earlier run (--keep-idle) were reused.
            "idle_load_s": idle_load_s,
            **self.table_sizes(),
            "cpu_count": os.cpu_count(),
        }
        if config.lane == "flexible":
            flex = self.lag_stats("available_at")
            result["lag_vs_available_p99_s"] = flex["lag_p99_s"]
            result["lag_vs_available_max_s"] = flex["lag_max_s"]
        result.update(after)
        if fault_result is not None:
            result["fault"] = fault_result
        if not config.keep:
            self.cleanup()
        return result

    def after_confirmed(self, t0: datetime) -> dict[str, Any]:
        """What a subclass measures once every fire is confirmed, before the processes stop (drain: execution)."""
        return {}

    def _wait_materialized(self, t0: datetime, inserted_before: int) -> float | None:
        """Wait until every fire has its occurrence; returns how many seconds before T0 that was."""
        total = self.config.schedules
        with tqdm(total=total, desc="materialize", unit="occ", file=self.out, mininterval=2) as bar:
            while True:
                done = self.shards_left(t0) == 0
                written = total if done else min(total - 1, self.occurrences_inserted() - inserted_before)
                bar.update(max(0, written - bar.n))
                if done:
                    self.fires_by_envelope = self.envelope_fires()
                    self.materialize_rate = self._materialize_rate()
                    return round((t0 - db_now()).total_seconds(), 1)
                if db_now() > t0 + timedelta(seconds=self.config.deadline_seconds):
                    return None
                self._check_alive()
                time.sleep(1.0)

    def _wait_confirmed(self, t0: datetime) -> int:
        total = self.config.schedules
        deadline = t0 + timedelta(
            seconds=self.config.deadline_seconds
            + self.config.flexible_window_seconds * (self.config.lane == "flexible")
        )
        with tqdm(total=total, desc="confirmed by broker", unit="occ", file=self.out, mininterval=2) as bar:
            while True:
                confirmed = max(bar.n, through_failover(self.confirmed_fires))
                bar.update(confirmed - bar.n)
                # Settling deletes confirmed envelopes once nothing is due, so "none left unpublished" also ends it.
                if confirmed >= total or self.unpublished == 0 or through_failover(db_now) > deadline:
                    return confirmed
                self._check_alive()
                time.sleep(0.25)

    def confirmed_fires(self) -> int:
        """Fires in envelopes the broker has confirmed so far (also sets `unpublished`, the envelopes left)."""
        published, self.unpublished = self.published_envelopes()
        self.confirmed_envelopes |= published
        return sum(self.fires_by_envelope.get(envelope_id, 0) for envelope_id in self.confirmed_envelopes)

    def _check_alive(self) -> None:
        for name, proc in self.processes:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}")
