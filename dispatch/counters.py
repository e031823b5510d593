"""Counters and histograms any process adds to, totalled in PostgreSQL so /metrics serves every process's counts.

Workers, relays and materializers run on many hosts; only web processes serve /metrics. Each process keeps its
counts as pending deltas in memory and adds them to dispatch_metric_counter with one upsert (`value = value +
delta`, rows in key order so two flushes never deadlock) in a short transaction of its own. The scrape reads one
small table: the total of every process on every host, kept through restarts and deploys (no resets). A failed
flush puts its deltas back; a process killed between flushes loses at most those seconds of counts, and never
counts anything twice. Why not prometheus-client's multiprocess mode: its files join the processes of one host only
(docs/DESIGN.md, "Counters live in PostgreSQL").

Every family is declared here, in one catalogue, so the scrape knows each one's type, help text and buckets.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from django.db import close_old_connections, connection, transaction
from prometheus_client.utils import floatToGoString

from dispatch.sql import leases as lease_sql
from dispatch.sql import metrics as metrics_sql

logger = logging.getLogger(__name__)

_pending: dict[tuple[str, str], float] = {}
_pending_lock = threading.Lock()


def _add(name: str, labels: str, amount: float) -> None:
    with _pending_lock:
        _pending[(name, labels)] = _pending.get((name, labels), 0.0) + amount


def label_text(labels: dict[str, str]) -> str:
    """The JSON text of a label set (stored as jsonb, so any key order meets the same row)."""
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


class Family:
    """A metric family of the catalogue: its samples live in dispatch_metric_counter."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], object] = {}
        FAMILIES[name] = self

    def _labels(self, values: tuple[str, ...], kwargs: dict[str, str]) -> dict[str, str]:
        if kwargs:
            values = tuple(kwargs[name] for name in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        return dict(zip(self.labelnames, (str(v) for v in values), strict=True))


class _CounterChild:
    __slots__ = ("_key",)

    def __init__(self, name: str, labels: dict[str, str]) -> None:
        self._key = (name, label_text(labels))

    def inc(self, amount: float = 1.0) -> None:
        if amount:
            _add(*self._key, amount)


class Counter(Family):
    """A monotonic count; exposed as `<name>_total`."""

    kind = "counter"

    def labels(self, *values: str, **kwargs: str) -> _CounterChild:
        child = self._children.get(values) if not kwargs else None  # the hot path: positional, seen before
        if child is None:
            key = tuple(kwargs[n] for n in self.labelnames) if kwargs else tuple(str(v) for v in values)
            child = self._children.get(key) or _CounterChild(self.name, self._labels(key, {}))
            self._children[key] = self._children[values] = child
        assert isinstance(child, _CounterChild)
        return child

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)


# Seconds: from what a strict fire's lateness looks like on a good day (milliseconds) to an outage (minutes).
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)


class _HistogramChild:
    __slots__ = ("_bounds", "_bucket_keys", "_count_key", "_sum_key")

    def __init__(self, family: Histogram, labels: dict[str, str]) -> None:
        self._bounds = family.buckets
        text = label_text(labels)
        # One stored row per bucket, not cumulative: an observation adds to one row; the scrape sums them up.
        self._bucket_keys = [
            (f"{family.name}_bucket", label_text({**labels, "le": le})) for le in family.bucket_labels()
        ]
        self._count_key = (f"{family.name}_count", text)
        self._sum_key = (f"{family.name}_sum", text)

    def observe(self, value: float, count: int = 1) -> None:
        """Add `count` observations of `value`."""
        bucket = self._bucket_keys[bisect.bisect_left(self._bounds, value)]
        with _pending_lock:
            for key, amount in ((bucket, count), (self._count_key, count), (self._sum_key, value * count)):
                _pending[key] = _pending.get(key, 0.0) + amount


class Histogram(Family):
    """Counts per `le` bound plus `_count` and `_sum`, only ever added to: a Prometheus histogram."""

    kind = "histogram"

    def __init__(
        self, name: str, documentation: str, labelnames: Iterable[str] = (), buckets: Iterable[float] = LAG_BUCKETS
    ) -> None:
        super().__init__(name, documentation, labelnames)
        self.buckets = tuple(sorted(float(b) for b in buckets))

    def bucket_labels(self) -> list[str]:
        """The `le` label of each bucket, "+Inf" last (the text the SQL writers use too)."""
        return [floatToGoString(b) for b in self.buckets] + ["+Inf"]

    def labels(self, *values: str, **kwargs: str) -> _HistogramChild:
        child = self._children.get(values) if not kwargs else None  # the hot path: positional, seen before
        if child is None:
            key = tuple(kwargs[n] for n in self.labelnames) if kwargs else tuple(str(v) for v in values)
            child = self._children.get(key) or _HistogramChild(self, self._labels(key, {}))
            self._children[key] = self._children[values] = child
        assert isinstance(child, _HistogramChild)
        return child

    def observe(self, value: float) -> None:
        self.labels().observe(value)


FAMILIES: dict[str, Family] = {}

# --- the catalogue --------------------------------------------------------------------------------------------

# Workers: claims and what became of the deliveries that were not claimed.
WORKER_CLAIMS = Counter("scheduler_worker_claims", "Occurrences claimed by a worker (attempts started).")
WORKER_CLAIM_DROPS = Counter(
    "scheduler_worker_claim_drops",
    "Deliveries not run, by reason (duplicate: a duplicate claim of a live attempt; missed, overlap_skipped, ...).",
    ["reason"],
)
WORKER_COMPLETIONS = Counter(
    "scheduler_worker_completions", "Attempt completions by resulting state (fenced: refused).", ["outcome"]
)
WORKER_HANDLER_SECONDS = Histogram(
    "scheduler_worker_handler_seconds", "Handler run time.", ["handler"], buckets=DURATION_BUCKETS
)
WORKER_DROPPED_MESSAGES = Counter(
    "scheduler_worker_dropped_messages", "Messages on the lanes' queues logged and dropped.", ["reason"]
)
WORKER_REAPED = Counter("scheduler_worker_reaped", "Expired leases reaped, by resulting state.", ["state"])
WORKER_CANCEL_SIGNALS = Counter(
    "scheduler_worker_cancel_signals", "Cancel events raised for running handlers.", ["reason"]
)
WORKER_RETRIES_LIMITED = Counter(
    "scheduler_worker_retries_limited", "Retries delayed by the tenant budget or ended by the deadline.", ["limit"]
)
WORKER_RETRIES = Counter("scheduler_worker_retries", "Attempts that ended in retry_wait (a retry is due).")
START_LAG = Histogram(
    "scheduler_start_lag_seconds",
    "First attempts (not forced): claim - release instant (available_at), by lane.",
    ["lane"],
)
# Misfires and overlap, wherever they were decided.
MISSED = Counter(
    "scheduler_missed_occurrences", "Occurrences recorded missed, by where lateness was judged.", ["stage"]
)
SKIPPED_OVERLAP = Counter("scheduler_skipped_overlap_occurrences", "Occurrences skipped by their overlap policy.")
# Materializers.
MATERIALIZED = Counter("scheduler_materialized_occurrences", "Occurrences the materializers wrote.")
MATERIALIZER_CONFLICTS = Counter(
    "scheduler_materializer_conflicts",
    "Planned fires whose row already existed (unique-key conflicts: a replayed batch, a hand-over, a backfill).",
)
# The materializers' upkeep (dispatch/upkeep.py): day partitions, retention, vacuum.
UPKEEP_FAILURES = Counter(
    "scheduler_upkeep_failures",
    "Upkeep tries that gave up (a lock busy past SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS) or failed, by task; each is "
    "tried again after SCHEDULER_UPKEEP_RETRY_SECONDS.",
    ["task"],
)
PARTITIONS_CREATED = Counter("scheduler_partitions_created", "Day partitions the upkeep created.")
PARTITIONS_DROPPED = Counter("scheduler_partitions_dropped", "Day partitions the upkeep dropped past the retention.")
PARTITIONS_KEPT = Counter(
    "scheduler_partitions_kept",
    "Day partitions past the retention an upkeep pass kept because they hold fires that can still run.",
)
UPKEEP_VACUUMS = Counter(
    "scheduler_upkeep_vacuums", "Tables the upkeep vacuumed because autovacuum does not look after them.", ["table"]
)
UPKEEP_ANALYZES = Counter(
    "scheduler_upkeep_analyzes",
    "Tables the upkeep analyzed (statistics only) because autovacuum does not look after them.",
    ["table"],
)
# Relays.
RELAY_PUBLISHED_ENVELOPES = Counter("scheduler_relay_published_envelopes", "Envelopes the broker confirmed.")
RELAY_PUBLISHED_OCCURRENCES = Counter(
    "scheduler_relay_published_occurrences", "Occurrences in envelopes the broker confirmed."
)
RELAY_FAILED_PUBLISHES = Counter(
    "scheduler_relay_failed_publishes", "Publishes refused, returned or lost with the channel (published again)."
)
RELAY_WITHDRAWN_ENVELOPES = Counter(
    "scheduler_relay_withdrawn_envelopes", "Staged envelopes dropped unpublished: all their occurrences withdrawn."
)
SETTLE_LAG = Histogram(
    "scheduler_settle_lag_seconds",
    "Settle time - broker confirmation of each envelope: how long a confirmed fire waits for its occurrences to show "
    "enqueued_at and for the lag histograms to count it.",
)
RELAY_PUBLISH_BACKOFFS = Counter(
    "scheduler_relay_publish_backoffs",
    "Publishes the broker refused (nacked or returned) whose envelope now backs off on its own, by queue.",
    ["queue"],
)
# Kept by the relay's settle step in SQL (dispatch/sql/outbox.py SETTLE_PUBLISHED), declared here for the scrape.
SCHEDULE_LAG = Histogram(
    "scheduler_schedule_lag_seconds",
    "Broker confirmation - release instant (available_at) of each occurrence's first publish, by lane; fires that "
    "waited for their tenant's max_fires_per_second are in scheduler_throttled_lag_seconds instead.",
    ["lane"],
)
THROTTLED_LAG = Histogram(
    "scheduler_throttled_lag_seconds",
    "The same lag for fires held back by their tenant's max_fires_per_second.",
    ["lane"],
)
TENANT_SCHEDULE_LAG = Histogram(
    "scheduler_tenant_schedule_lag_seconds",
    'scheduler_schedule_lag_seconds per tenant: the busiest tenants by name, every other one as tenant="other".',
    ["lane", "tenant"],
)


# --- flushing -------------------------------------------------------------------------------------------------


def _take() -> dict[tuple[str, str], float]:
    global _pending
    with _pending_lock:
        taken, _pending = _pending, {}
    return taken


def _put_back(deltas: dict[tuple[str, str], float]) -> None:
    with _pending_lock:
        for key, amount in deltas.items():
            _pending[key] = _pending.get(key, 0.0) + amount


def flush() -> int:
    """Add this process's pending deltas to the stored totals; returns how many samples were written.

    Raises nothing: a failed flush (the database away) keeps the deltas for the next one.
    """
    deltas = _take()
    if not deltas:
        return 0
    keys = sorted(deltas)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                metrics_sql.ADD_TO_COUNTERS,
                {
                    "names": [name for name, _ in keys],
                    "labels": [labels for _, labels in keys],
                    "deltas": [deltas[key] for key in keys],
                },
            )
    except Exception as exc:
        _put_back(deltas)
        logger.warning("metric flush failed, kept for the next one: %r", exc, extra={"action": "metrics_flush"})
        return 0
    return len(keys)


def stored_value(name: str, **labels: str) -> float:
    """One sample's total: stored plus this process's pending delta (tests and diagnostics)."""
    text = label_text(labels)
    with connection.cursor() as cursor:
        cursor.execute(metrics_sql.COUNTER_VALUE, {"name": name, "labels": text})
        row = cursor.fetchone()
    with _pending_lock:
        pending = _pending.get((name, text), 0.0)
    return (row[0] if row else 0.0) + pending


def write_heartbeat(cursor, name: str, role: str) -> None:
    """This process is alive, and how far its wall clock is from PostgreSQL's."""
    cursor.execute(lease_sql.PROCESS_HEARTBEAT, {"name": name, "role": role, "process_now": datetime.now(UTC)})


class Flusher:
    """A thread that flushes the process's counts every `interval` seconds (and, for processes without a loop of
    their own, such as Celery pool processes, writes their heartbeat), then once more when stopped."""

    def __init__(self, interval: float, heartbeat: tuple[str, str] | None = None) -> None:
        self.interval = interval
        self.heartbeat = heartbeat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-flusher", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        if self.heartbeat is None:
            return
        try:
            with connection.cursor() as cursor:
                write_heartbeat(cursor, *self.heartbeat)
        except Exception as exc:
            logger.warning("heartbeat failed: %r", exc, extra={"action": "heartbeat_error"})
            connection.close()

    def _run(self) -> None:
        try:
            self._beat()
            while not self._stop.wait(self.interval):
                close_old_connections()
                flush()
                self._beat()
        finally:
            flush()
            if self.heartbeat is not None:
                try:
                    with connection.cursor() as cursor:
                        cursor.execute(lease_sql.FORGET_PROCESS, {"name": self.heartbeat[0]})
                except Exception:
                    logger.debug("could not forget heartbeat %s", self.heartbeat[0], exc_info=True)
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


_flusher: Flusher | None = None
_flusher_pid: int | None = None
_flusher_lock = threading.Lock()


def start_flushing(interval: float, heartbeat: Callable[[], tuple[str, str]] | None = None) -> None:
    """Start this process's flusher once (a forked child starts its own: threads do not survive fork)."""
    global _flusher, _flusher_pid
    with _flusher_lock:
        if _flusher is None or _flusher_pid != os.getpid():
            if _flusher_pid != os.getpid():
                _take()  # deltas inherited from the parent through fork are the parent's to flush
            _flusher, _flusher_pid = Flusher(interval, heartbeat() if heartbeat else None), os.getpid()


def stop_flushing() -> None:
    """Stop the flusher after a last flush (process exit, test teardown)."""
    global _flusher
    with _flusher_lock:
        flusher, _flusher = _flusher, None
    if flusher is not None and _flusher_pid == os.getpid():
        flusher.stop()
