"""The steady benchmark: a production day's rhythm through the real materializer, relay and Celery workers.

The platform is sized for 200 M fires a day, 2,315 a second all day across many tenants, with a burst on the hour
(docs/ARCHITECTURE.md, "What it must hold"). Bursts are measured by `bench burst`; this measures the day between
them, where what goes wrong is slow: settling that falls behind, an outbox that grows, memory that creeps, dead rows
a day without vacuum leaves.

1. Tenants: T rows of their own (engine rows only: no schema per tenant, which would take minutes to create for a
   thousand and plays no part in dispatch). Schedules: R x P `interval` schedules firing every P seconds (60 by
   default), anchored at whole seconds so that exactly R fall due in every second of the window; with --burst N, N
   strict cron schedules more at every whole ten minutes.
2. The window opens a warm-up after the processes start and lasts M minutes; only fires due inside it are counted.
3. A sampler polls the outbox (size, unsettled envelopes and how long each took to settle), each role's memory and
   the hot tables' dead rows (dispatch/bench/sampling.py).
4. Once every fire of the window has run (or a deadline passed), the durable record gives the lags, lost fires,
   duplicate runs and the bytes each fire left in the occurrence (with its watch), attempt and outbox tables.
"""

from __future__ import annotations

import bisect
import csv
import math
import os
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from tqdm import tqdm

from core.clock import db_now
from dispatch.bench.drain import DrainBenchmark, DrainConfig
from dispatch.bench.rows import BENCH_TENANT_PREFIX, SCHEDULE_COLUMNS, UNTHROTTLED, schedule_row
from dispatch.bench.sampling import Readings, Sampler
from dispatch.bench.steady_stats import postgres_during, postgres_facts, settle_buckets, steady_stats
from dispatch.sql import database_conninfo
from dispatch.sql import quotas as quota_sql
from schedules.models import PLANNING_FIELDS
from tenants.models import Tenant, schema_name_for

STEADY_PREFIX = f"{BENCH_TENANT_PREFIX}s"
BURST_CRON = "*/10 * * * *"
# Until the window opens, after a horizon: the processes start and connect, the materializer writes its first
# horizon (a minute of fires at once, a burst of its own that a deployment running all day never sees), and the
# relay and workers work that off, so the window measures the steady state.
WARMUP_SECONDS = 30.0
# After the window closes: how long its last fires may take to run before they count as lost.
DRAIN_SECONDS = 120.0
# The settle-lag figures are the window's: the relay's histogram is read as the window opens and again this long after
# it closes (its last envelopes settled), before the benchmark starts counting the window's ended fires. That count
# reads every row of the window, seconds of a loaded server's time while the processes go on: read at the very end,
# the histogram took in the envelopes settled behind it (a 12-minute run: 6,250 envelopes 2 s late after the window,
# against 1,600 in it). Envelopes still waiting at the second reading are counted at the wait they had then. The grace
# covers the settle delay (0.75 s) and the relay's counter flush (every SCHEDULER_HEARTBEAT_SECONDS, 5 s), twice over:
# an envelope settled but not flushed yet is in neither reading.
SETTLE_GRACE_SECONDS = 12.0


@dataclass
class SteadyConfig(DrainConfig):
    rate: int = 0
    minutes: float = 0.0
    burst: int = 0
    period_seconds: int = 60
    warmup_seconds: float = WARMUP_SECONDS
    series_out: str | None = None


class SteadyBenchmark(DrainBenchmark):
    handler = "noop"
    config: SteadyConfig

    def __init__(self, config: SteadyConfig, out=sys.stdout) -> None:
        config.schedules = config.rate * config.period_seconds + config.burst
        super().__init__(config, out)
        self.window_start: datetime | None = None
        self.window_end: datetime | None = None
        self.bursts: list[datetime] = []
        self.settle_before: dict[float, float] | None = None
        self.settle_after: dict[float, float] | None = None

    # --- setup -------------------------------------------------------------------------------------------------

    def provision(self) -> list[Tenant]:
        """T tenant rows without schemas: the engine keys everything by tenant id, and a schema (with its API user
        and token) per tenant would cost about half a second each and play no part in what is measured."""
        now = db_now()
        tenants = [
            Tenant(
                slug=f"{STEADY_PREFIX}{n + 1}",
                schema_name=schema_name_for(f"{STEADY_PREFIX}{n + 1}"),
                name=f"steady bench {n + 1}",
                created_at=now,
                updated_at=now,
                **UNTHROTTLED,
            )
            for n in range(self.config.tenants)
        ]
        created = Tenant.objects.bulk_create(tenants, batch_size=1000)
        self.tenant_ids = [t.id for t in created]
        return created

    def delete_tenants(self, tenants: list[Tenant]) -> None:
        """The steady bench's tenants have no schema and, by now, no rows: one statement for the thousand of them,
        then their per-tenant engine rows as the deletion service forgets them (through it, one at a time, a
        thousand tenants took minutes)."""
        ids = [tenant.id for tenant in tenants if tenant.slug.startswith(STEADY_PREFIX)]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM tenants_domain WHERE tenant_id = ANY(%s)", [ids])
            cursor.execute("DELETE FROM tenants_tenant WHERE id = ANY(%s)", [ids])
            cursor.execute(quota_sql.FORGET_DELETED_TENANTS, {"tenant_ids": ids})
        super().delete_tenants([tenant for tenant in tenants if not tenant.slug.startswith(STEADY_PREFIX)])

    def write_schedules(self, tenants: list[Tenant], window_start: datetime) -> None:
        """COPY the interval schedules (R per second of phase) and the burst's cron ones, then their cursors and
        first versions, in a few statements: a hundred thousand API calls would take longer than the run."""
        config = self.config
        now = db_now()
        steady = config.rate * config.period_seconds
        first_burst = _next_whole_ten_minutes(window_start)
        with (
            connection.cursor() as wrapper,
            tqdm(total=steady + config.burst, desc="create schedules", unit="sch", file=self.out, mininterval=2) as bar,
        ):
            with wrapper.cursor.copy(f"COPY schedules_schedule ({SCHEDULE_COLUMNS}) FROM STDIN") as copy:
                for n in range(steady + config.burst):
                    is_burst = n >= steady
                    # The R schedules of one phase go to R consecutive tenants (round robin), so every second's
                    # fires are spread over the tenants as a day's are, not all of one tenant's.
                    tenant = tenants[(n // config.period_seconds if not is_burst else n) % len(tenants)]
                    if is_burst:
                        row = schedule_row(
                            uuid.uuid4(), tenant.id, f"bench-burst-{n}", handler=self.handler, now=now, cron=BURST_CRON
                        )
                    else:
                        # Phase n mod P: each second of the period has exactly R schedules due in it.
                        anchor = window_start + timedelta(seconds=n % config.period_seconds)
                        row = schedule_row(
                            uuid.uuid4(),
                            tenant.id,
                            f"bench-steady-{n}",
                            handler=self.handler,
                            now=now,
                            every_seconds=config.period_seconds,
                            anchor_at=anchor,
                        )
                    copy.write_row(row)
                    if n % 10000 == 0:
                        bar.update(min(10000, steady + config.burst - bar.n))
            bar.update(steady + config.burst - bar.n)
            planning = ", ".join(PLANNING_FIELDS)
            wrapper.execute(
                f"""
                INSERT INTO schedules_schedulecursor (schedule_id, tenant_id, shard, version, next_run_at, {planning})
                SELECT id, tenant_id, shard, version, CASE WHEN kind = 'interval' THEN anchor_at ELSE %s END, {planning}
                FROM schedules_schedule WHERE tenant_id = ANY(%s)
                """,
                [first_burst, self.tenant_ids],
            )
            wrapper.execute(
                """
                INSERT INTO schedules_scheduleversion (schedule_id, tenant_id, version, change, definition, valid_from,
                                                       actor)
                SELECT id, tenant_id, 1, 'create',
                       jsonb_build_object('name', name, 'kind', kind, 'cron', cron, 'run_at', NULL,
                                          'every_seconds', every_seconds, 'anchor_at', anchor_at,
                                          'timezone', timezone, 'lane', lane, 'state', state, 'handler', handler),
                       %s, 'bench'
                FROM schedules_schedule WHERE tenant_id = ANY(%s)
                """,
                [now, self.tenant_ids],
            )
            for table in ("schedules_schedule", "schedules_schedulecursor", "schedules_scheduleversion"):
                wrapper.execute(f"VACUUM ANALYZE {table}")

    # --- run ---------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        config = self.config
        self.say(
            f"bench steady: {config.rate} fires/s over {config.tenants} tenants for {config.minutes} min "
            f"(every {config.period_seconds} s), burst {config.burst} at each whole 10 minutes, "
            f"{config.workers} workers x {config.concurrency}"
        )
        self.check_quiet()
        self.cleanup()
        started = time.monotonic()
        tenants = self.provision()
        # The window opens after the setup (about 15,000 schedules a second here) and the warm-up.
        lead = self.horizon + config.warmup_seconds + config.schedules / 15_000 + 5
        window_start = (db_now() + timedelta(seconds=lead)).replace(microsecond=0)
        self.window_start = window_start
        self.window_end = window_start + timedelta(seconds=round(config.minutes * 60))
        self.bursts = _whole_ten_minutes_in(window_start, self.window_end) if config.burst else []
        self.write_schedules(tenants, window_start)
        self.flush_setup()
        self.say(
            f"window {window_start.isoformat()} .. {self.window_end.isoformat()} (opens in "
            f"{(window_start - db_now()).total_seconds():.0f} s); {len(self.bursts)} bursts; "
            f"setup took {time.monotonic() - started:.1f} s"
        )
        postgres_before = postgres_facts()
        self.start_processes(self.horizon)
        sampler = Sampler(database_conninfo(), self._role_pids(), window_start)
        sampler.start()
        readings = Readings()
        try:
            self._wait_window()
            readings = sampler.stop()
        finally:
            if sampler.readings is not readings:
                readings = sampler.stop()
            peaks = self.stop_processes()
        postgres = postgres_during(postgres_before, postgres_facts())
        result = {
            "rate": config.rate,
            "tenants": config.tenants,
            "minutes": config.minutes,
            "burst": config.burst,
            "bursts": len(self.bursts),
            "period_s": config.period_seconds,
            "workers": config.workers,
            "queue_type": config.queue_type,
            "concurrency": config.concurrency,
            **steady_stats(self, readings),
            "peak_rss_mb": peaks,
            "postgres": postgres,
            "cpu_count": os.cpu_count(),
            "window_start": window_start.isoformat(),
        }
        if config.series_out:
            self.write_series(config.series_out, readings)
        if not config.keep:
            self.cleanup()
        return result

    def expected_fires(self) -> int:
        """Fires due in the window: R in each of its seconds, and N at each whole ten minutes in it."""
        assert self.window_start is not None and self.window_end is not None
        seconds = int((self.window_end - self.window_start).total_seconds())
        return self.config.rate * seconds + self.config.burst * len(self.bursts)

    def _role_pids(self) -> dict[str, list[int]]:
        roles: dict[str, list[int]] = {}
        for name, proc in [*self.processes, *self.workers]:
            roles.setdefault(name.rsplit("-", 1)[0], []).append(proc.pid)
        return roles

    def _wait_window(self) -> None:
        """Until every fire of the window has ended (or the drain deadline after it), showing the window's time."""
        assert self.window_start is not None and self.window_end is not None
        total = self.expected_fires()
        deadline = self.window_end + timedelta(seconds=DRAIN_SECONDS)
        span = (self.window_end - self.window_start).total_seconds()
        pause = 2.0
        with tqdm(total=round(span), desc="window", unit="s", file=self.out, mininterval=5) as bar:
            while True:
                now = db_now()
                elapsed = min(span, max(0.0, (now - self.window_start).total_seconds()))
                bar.update(round(elapsed) - bar.n)
                if self.settle_before is None and now >= self.window_start:
                    self.settle_before = settle_buckets()
                if now >= self.window_end + timedelta(seconds=SETTLE_GRACE_SECONDS):
                    if self.settle_after is None:
                        self.settle_after = settle_buckets(waiting=True)
                    # The count reads every row of the window (seconds on a loaded server): waiting four times
                    # its duration between counts keeps the bench's own reads to a fifth of one core while the
                    # backlog it measures drains, instead of most of it.
                    counted = time.monotonic()
                    if self._ended_in_window() >= total:
                        return
                    pause = max(1.0, 4 * (time.monotonic() - counted))
                if now > deadline:
                    self.say(f"drain deadline passed with {total - self._ended_in_window()} fires not ended")
                    return
                self._check_alive()
                time.sleep(pause)

    def _ended_in_window(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM dispatch_occurrence WHERE scheduled_for >= %s AND scheduled_for < %s"
                " AND tenant_id = ANY(%s) AND state IN ('succeeded', 'dead', 'missed', 'canceled', 'skipped_overlap')",
                [self.window_start, self.window_end, self.tenant_ids],
            )
            return cursor.fetchone()[0]

    def write_series(self, path: str, readings: Readings) -> None:
        """One row per outbox sample, with the confirmation lag of the fires due in that ten-second slice: the
        chart's input (scripts/bench_chart.py steady)."""
        assert self.window_start is not None
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT floor(EXTRACT(EPOCH FROM o.scheduled_for - %(start)s) / 10) * 10 AS slice,
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY l.lag),
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY l.lag),
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY l.start_lag)
                FROM dispatch_occurrence AS o
                LEFT JOIN dispatch_attempt AS a
                  ON a.occurrence_id = o.occurrence_id AND a.scheduled_for = o.scheduled_for AND a.generation = 1
                CROSS JOIN LATERAL (SELECT EXTRACT(EPOCH FROM o.enqueued_at - o.scheduled_for) AS lag,
                                           EXTRACT(EPOCH FROM a.started_at - o.scheduled_for) AS start_lag) AS l
                WHERE o.tenant_id = ANY(%(t)s) AND o.scheduled_for >= %(start)s AND o.scheduled_for < %(end)s
                  AND o.enqueued_at IS NOT NULL
                GROUP BY 1
                """,
                {"start": self.window_start, "end": self.window_end, "t": self.tenant_ids},
            )
            lags = {int(row[0]): row[1:] for row in cursor.fetchall()}
        roles = sorted(readings.rss)
        with open(path, "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(
                ["at_s", "outbox_rows", "unsettled", "oldest_unsettled_s", "lag_p50_s", "lag_p99_s", "start_lag_p99_s"]
                + [f"{role}_rss_mb" for role in roles]
                + ["settled", "settled_late"]
            )
            settled = [(at, total) for at, total, _ in readings.settled]
            settled_late = [(at, late) for at, _, late in readings.settled]
            for sample in readings.samples:
                p50, p99, start_p99 = lags.get(int(math.floor(sample.at / 10) * 10), (None, None, None))
                writer.writerow(
                    [
                        sample.at,
                        sample.outbox_rows,
                        sample.unsettled,
                        sample.oldest_unsettled_s,
                        "" if p50 is None else round(float(p50), 3),
                        "" if p99 is None else round(float(p99), 3),
                        "" if start_p99 is None else round(float(start_p99), 3),
                    ]
                    + [_reading_at(readings.rss[role], sample.at) for role in roles]
                    + [_reading_at(settled, sample.at), _reading_at(settled_late, sample.at)]
                )


def _reading_at(series: list[tuple[float, float]], at: float) -> float | str:
    """The last reading of a time-ordered series taken at or before `at` ("" before the first)."""
    index = bisect.bisect_right(series, at, key=lambda reading: reading[0])
    return series[index - 1][1] if index else ""


def _next_whole_ten_minutes(after: datetime) -> datetime:
    """The first whole ten minutes at or after `after` (UTC)."""
    base = after.replace(second=0, microsecond=0)
    base -= timedelta(minutes=base.minute % 10)
    return base if base >= after else base + timedelta(minutes=10)


def _whole_ten_minutes_in(start: datetime, end: datetime) -> list[datetime]:
    instants = []
    at = _next_whole_ten_minutes(start)
    while at < end:
        instants.append(at)
        at += timedelta(minutes=10)
    return instants
