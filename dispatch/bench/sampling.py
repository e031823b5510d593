"""What the steady benchmark watches while it runs: the outbox, settling, memory and dead rows, sampled on a thread.

Each reading is cheap (the outbox's small columns, /proc, pg_stat_user_tables), made on a connection of its own, so
the sampler costs the run it measures little and never holds a lock the processes wait for.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psycopg

from dispatch import counters

# The tables the engine rewrites all day; their dead row versions are what a day without vacuum leaves behind. The
# day partitions of the occurrence and attempt tables are summed under their parent's name.
HOT_TABLES = (
    "schedules_schedulecursor",
    "dispatch_outboxmessage",
    "dispatch_occurrence",
    "dispatch_occurrence_watch",
    "dispatch_attempt",
    "dispatch_metric_counter",
    "dispatch_tenant_fire_bucket",
    "dispatch_tenant_running",
    "dispatch_processheartbeat",
    "dispatch_shardlease",
)
# The outbox is read this often (one pass over its small columns), or less: the pass costs ~1 us a row, and at 80,000
# rows a poll a second took 8 % of the database's core from the run it measures. The sampler keeps its share under
# OUTBOX_POLL_SHARE of one core by waiting longer as the outbox grows.
OUTBOX_POLL_SECONDS = 1.0
OUTBOX_POLL_SHARE = 0.02
SLOW_POLL_SECONDS = 5.0
# A thread that only sleeps STALL_TICK_SECONDS at a time and wakes STALL_SECONDS late or more saw the whole host stop
# (a virtual machine paused, the disk frozen), not the run's own load: on this benchmark's two-core machine every
# process, vmstat included, once stood still for 14 s, and that minute's lags were the host's, not the product's. Such
# stalls are reported with the run (`host_stalls`), so a run that had one can be told apart.
STALL_TICK_SECONDS = 0.2
STALL_SECONDS = 2.0
# The settle-lag target's bound: the series counts the envelopes settled later than this, as they accumulate.
SETTLE_LATE_SECONDS = 2.0


def tree_rss_mb(pid: int) -> float | None:
    """Resident memory (VmRSS) of a process and its children (a Celery worker's pool), in MiB; None once gone."""
    pids = [pid]
    try:
        pids += [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return None
    total = 0
    for each in pids:
        try:
            for line in Path(f"/proc/{each}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return round(total / 1024, 1)


@dataclass
class Sample:
    at: float  # seconds since the window opened (negative during the warm-up)
    outbox_rows: int
    unpublished: int
    unsettled: int
    oldest_unsettled_s: float


@dataclass
class Readings:
    samples: list[Sample] = field(default_factory=list)
    # The longest any confirmed envelope had waited to be settled when a poll looked: the histogram's check.
    oldest_unsettled_max: float = 0.0
    # role -> [(seconds since the window opened, MiB)]
    rss: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    dead_tuples_max: dict[str, int] = field(default_factory=dict)
    # [(seconds since the window opened, seconds the host stood still)]
    host_stalls: list[tuple[float, float]] = field(default_factory=list)
    # [(seconds since the window opened, envelopes settled so far, of them after SETTLE_LATE_SECONDS or more)], from the
    # relay's stored histogram: when in the window the settle tail formed.
    settled: list[tuple[float, float, float]] = field(default_factory=list)


class Sampler:
    """Polls until stopped; `readings` holds what it saw. `roles` maps a role name to the pids it watches."""

    def __init__(self, conninfo: str, roles: dict[str, list[int]], window_start: datetime) -> None:
        self.conninfo = conninfo
        self.roles = roles
        self.window_start = window_start
        self.readings = Readings()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._stall_watch = threading.Thread(target=self._watch_stalls, name="bench-stall-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._stall_watch.start()

    def stop(self) -> Readings:
        self._stop.set()
        self._thread.join(timeout=30)
        self._stall_watch.join(timeout=30)
        return self.readings

    def _watch_stalls(self) -> None:
        before = time.monotonic()
        while not self._stop.wait(STALL_TICK_SECONDS):
            now = time.monotonic()
            stood_still = now - before - STALL_TICK_SECONDS
            if stood_still >= STALL_SECONDS:
                at = time.time() - stood_still - self.window_start.timestamp()
                self.readings.host_stalls.append((round(at, 1), round(stood_still, 1)))
            before = now

    def _run(self) -> None:
        next_slow = 0.0
        with psycopg.connect(self.conninfo, autocommit=True, application_name="bench-sampler") as db:
            while not self._stop.is_set():
                started = time.monotonic()
                self._sample_outbox(db)
                if started >= next_slow:
                    self._sample_memory(db)
                    self._sample_dead_tuples(db)
                    self._sample_settled(db)
                    next_slow = started + SLOW_POLL_SECONDS
                took = time.monotonic() - started
                self._stop.wait(max(OUTBOX_POLL_SECONDS, took / OUTBOX_POLL_SHARE) - took)

    def _since_window(self, db: psycopg.Connection) -> tuple[datetime, float]:
        row = db.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        now = row[0]
        return now, (now - self.window_start).total_seconds()

    def _sample_outbox(self, db: psycopg.Connection) -> None:
        """The outbox's size, its confirmed-but-unsettled envelopes and the oldest of them: one pass over the rows'
        small columns. Every envelope's settle lag is the relay's own histogram (steady_stats.settle_buckets)."""
        row = db.execute(
            """
            SELECT clock_timestamp(), count(*), count(published_at), min(published_at)
            FROM dispatch_outboxmessage
            """
        ).fetchone()
        assert row is not None
        now, rows, unsettled, oldest = row
        self.readings.samples.append(
            Sample(
                at=round((now - self.window_start).total_seconds(), 2),
                outbox_rows=rows,
                unpublished=rows - unsettled,
                unsettled=unsettled,
                oldest_unsettled_s=round((now - oldest).total_seconds(), 2) if oldest else 0.0,
            )
        )
        if oldest is not None:
            self.readings.oldest_unsettled_max = max(self.readings.oldest_unsettled_max, (now - oldest).total_seconds())

    def _sample_memory(self, db: psycopg.Connection) -> None:
        _, at = self._since_window(db)
        for role, pids in self.roles.items():
            sizes = [size for size in (tree_rss_mb(pid) for pid in pids) if size is not None]
            if sizes:
                self.readings.rss.setdefault(role, []).append((round(at, 1), round(sum(sizes), 1)))

    def _sample_settled(self, db: psycopg.Connection) -> None:
        """Envelopes settled so far and those settled SETTLE_LATE_SECONDS or more after their stamp (the histogram's
        buckets above that bound), as the relay last flushed them."""
        row = db.execute(
            """
            SELECT clock_timestamp(), COALESCE(sum(value), 0),
                   COALESCE(sum(value) FILTER (WHERE (labels->>'le')::float8 > %s), 0)
            FROM dispatch_metric_counter WHERE name = %s
            """,
            [SETTLE_LATE_SECONDS, f"{counters.SETTLE_LAG.name}_bucket"],
        ).fetchone()
        assert row is not None
        now, settled, late = row
        at = (now - self.window_start).total_seconds()
        self.readings.settled.append((round(at, 1), float(settled), float(late)))

    def _sample_dead_tuples(self, db: psycopg.Connection) -> None:
        rows = db.execute(
            """
            SELECT COALESCE(parent.relname, st.relname), sum(st.n_dead_tup)::bigint
            FROM pg_stat_user_tables AS st
            LEFT JOIN pg_inherits AS i ON i.inhrelid = st.relid
            LEFT JOIN pg_class AS parent ON parent.oid = i.inhparent
            WHERE COALESCE(parent.relname, st.relname) = ANY(%s)
            GROUP BY 1
            """,
            [list(HOT_TABLES)],
        ).fetchall()
        for table, dead in rows:
            self.readings.dead_tuples_max[table] = max(self.readings.dead_tuples_max.get(table, 0), int(dead))
