"""The console dashboard (the admin index): the questions an operator asks first, as charts drawn server-side.

Every figure comes from PostgreSQL at page load (dispatch/sql/dashboard.py says how each read stays bounded); the
charts are drawn by dispatch/charts.py.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils.safestring import SafeString

from core.choices import Lane
from core.clock import DB_NOW
from core.cron_syntax import TimeRuleError
from core.timerules import TimeRule
from dispatch.charts import NO_DATA, Series, bar_chart, line_chart, stacked_bars
from dispatch.sql import dashboard as dashboard_sql
from dispatch.stuck import DEFAULT_STUCK_AFTER_SECONDS, STUCK_PAGE, stuck_pages

logger = logging.getLogger(__name__)

WINDOW_MINUTES = 60
# The chart of fires due ahead covers this many minutes from now.
DUE_MINUTES = 60
# Above this many occurrences in the window the chart reads a sample (TABLESAMPLE SYSTEM), scaled back up.
SAMPLE_ROWS = 200_000
TENANT_ROWS = 12
# A process whose heartbeat is older than this is shown as silent (and, older still, not at all).
SILENT_AFTER_SECONDS = 30
RECENT_PROCESSES_SECONDS = 600
STATE_COLORS = {
    "succeeded": "#2e7d32",
    "running": "#1565c0",
    "enqueued": "#64b5f6",
    "scheduled": "#b0bec5",
    "retry_wait": "#f9a825",
    "dead": "#c62828",
    "missed": "#8e24aa",
    "skipped_overlap": "#6d4c41",
    "canceled": "#757575",
}
# The lag quantiles: colours of the Okabe-Ito palette (told apart with every common colour vision deficiency), and
# dash patterns besides, so no line is known by its colour alone. Each lane has its own chart.
QUANTILE_STYLES = {"p50": ("#0072B2", ""), "p95": ("#E69F00", "7 3"), "p99": ("#D55E00", "2 2")}
LANES = tuple(Lane.values)
# The missed tile counts fires recorded missed whose fire time is in this window before now: exactly the occurrence
# list its link opens (?state__exact=missed&scheduled_after=now-1h).
MISSED_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class LagWindow:
    """A span the lag chart can cover: its bucket keeps the chart near 60-100 points, its labels one per `label_every`
    buckets (every 10 minutes, hourly, every 4 hours, daily) in `label_format`. A custom range has its bounds in
    `since` and `until`; the others end now."""

    key: str
    title: str
    minutes: int
    bucket_minutes: int
    label_every: int
    label_format: str = "%H:%M"
    since: datetime | None = None
    until: datetime | None = None


LAG_WINDOWS = {
    window.key: window
    for window in (
        LagWindow("1h", "last hour", 60, 1, 10),
        LagWindow("6h", "last 6 hours", 360, 5, 12),
        LagWindow("24h", "last 24 hours", 1440, 15, 16),
        LagWindow("7d", "last 7 days", 7 * 1440, 120, 12, "%m-%d"),
    )
}
DEFAULT_LAG_WINDOW = "1h"
# A custom range spans at most the longest window: its read is bounded like that one's (a sample of its days'
# partitions), whatever an operator types.
CUSTOM_MAX = timedelta(days=7)
# Bucket sizes and label spacings (minutes) a custom range picks from: the smallest bucket that keeps the chart to
# CUSTOM_POINTS points, the smallest spacing (a multiple of the bucket) that keeps it to CUSTOM_LABELS labels.
CUSTOM_BUCKETS = (1, 5, 15, 30, 60, 120)
CUSTOM_SPACINGS = (10, 30, 60, 120, 240, 360, 720, 1440)
CUSTOM_POINTS, CUSTOM_LABELS = 100, 8


def lag_window(value: Any) -> LagWindow:
    """The window a query parameter asks for; anything else (absent, misspelt, a list) is the default hour."""
    return LAG_WINDOWS.get(value if isinstance(value, str) else "", LAG_WINDOWS[DEFAULT_LAG_WINDOW])


def custom_lag_window(since: datetime, until: datetime, *, now: datetime, title: str = "") -> LagWindow:
    """The lag chart over [since, until) (until no later than now), at most CUSTOM_MAX long. Raises ValueError with
    the reason an operator reads."""
    until = min(until, now)
    if since >= until:
        raise ValueError("the range must start before it ends, and before now")
    if until - since > CUSTOM_MAX:
        raise ValueError(f"a range spans at most {CUSTOM_MAX.days} days")
    minutes = max(1, math.ceil((until - since).total_seconds() / 60))
    bucket = next(b for b in CUSTOM_BUCKETS if minutes / b <= CUSTOM_POINTS)
    spacing = next(s for s in CUSTOM_SPACINGS if s % bucket == 0 and minutes / s <= CUSTOM_LABELS)
    label_format = "%m-%d" if spacing >= 1440 else "%H:%M"
    return LagWindow("custom", title or "custom range", minutes, bucket, spacing // bucket, label_format, since, until)


@dataclass
class Dashboard:
    now: datetime
    sample_percent: float
    minutes: list[datetime]
    lag_window: LagWindow = LAG_WINDOWS[DEFAULT_LAG_WINDOW]
    lag_buckets: list[datetime] = field(default_factory=list)  # the lag chart's x axis (minutes for the hour)
    lag_sample_percent: float = 100.0
    lag: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)  # lane -> quantile -> per bucket
    states: dict[str, list[int]] = field(default_factory=dict)  # state -> per minute
    recent_by_tenant: dict[int, int] = field(default_factory=dict)
    # Fires of the last hour that reached the broker, each counted once however often it was offered again.
    sent_by_tenant: dict[int, int] = field(default_factory=dict)
    due: list[tuple[datetime, int]] = field(default_factory=list)
    backlog: dict[str, float] = field(default_factory=dict)
    dead: int = 0  # the DLQ: dead, not resolved (dispatch/dlq.py), as the list its tile opens
    # Fires recorded missed in the MISSED_WINDOW, as the list its tile opens; estimated from the sample (and said
    # so) when the hour is sampled: the exact count would read every row of the hour.
    missed: int = 0
    missed_estimated: bool = False
    stuck: int = 0
    stuck_capped: bool = False
    tenants: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    # The figures are those of these tenants only (a tenant-scoped operator); the platform-wide ones (the relay's
    # backlog, what falls due next) are then not read at all.
    tenant_ids: list[int] | None = None

    # --- charts ------------------------------------------------------------------------------------------------

    def lag_series(self) -> dict[str, list[Series]]:
        """Per lane (every lane, with or without data), its p50, p95 and p99 lines in their colours and dashes."""
        width = len(self.lag_buckets or self.minutes)
        lanes = list(LANES) + sorted(set(self.lag) - set(LANES))
        return {
            lane: [
                Series(quantile, color, self.lag.get(lane, {}).get(quantile, [None] * width), dash)
                for quantile, (color, dash) in QUANTILE_STYLES.items()
            ]
            for lane in lanes
        }

    def lag_panels(self) -> list[dict[str, Any]]:
        """One chart per lane; a lane without a fire enqueued in the window says NO_DATA instead of disappearing."""
        return [
            {
                "lane": lane,
                "has_data": any(line.has_data for line in series),
                "chart": line_chart(
                    series,
                    self.lag_buckets or self.minutes,
                    unit="s",
                    empty=f"{lane} lane: {NO_DATA} (no fire of this lane was enqueued in the {self.lag_window.title})",
                    title=f"enqueue lag, {lane} lane",
                    label_every=self.lag_window.label_every,
                    label_format=self.lag_window.label_format,
                ),
            }
            for lane, series in self.lag_series().items()
        ]

    def lag_choices(self) -> list[dict[str, Any]]:
        return [{"key": w.key, "title": w.key, "selected": w == self.lag_window} for w in LAG_WINDOWS.values()]

    def states_chart(self) -> SafeString:
        stacks = [(state, STATE_COLORS.get(state, "#999"), counts) for state, counts in self.states.items()]
        empty = f"No fire was due in the last hour: {NO_DATA}."
        return stacked_bars(stacks, self.minutes, empty=empty, title="fires per minute by state")

    def due_chart(self) -> SafeString:
        start = self.now.replace(second=0, microsecond=0)
        return bar_chart(self.due, start=start, minutes=DUE_MINUTES, empty="Nothing falls due in the next hour.")


def build(*, shards: int | None = None, lag: LagWindow | None = None, tenant_ids: list[int] | None = None) -> Dashboard:
    """The dashboard's figures, of every tenant or of `tenant_ids` only (a tenant-scoped operator's)."""
    shards = shards or settings.SCHEDULER_SHARDS
    lag = lag or LAG_WINDOWS[DEFAULT_LAG_WINDOW]
    with connection.cursor() as cursor:
        cursor.execute(DB_NOW)
        now = cursor.fetchone()[0]
        since = (now - timedelta(minutes=WINDOW_MINUTES)).replace(second=0, microsecond=0)
        minutes = [since + timedelta(minutes=n) for n in range(WINDOW_MINUTES + 1)]
        percent = _sample_percent(cursor, since, now)
        dash = Dashboard(
            now=now,
            sample_percent=percent,
            minutes=minutes,
            lag_window=lag,
            lag_sample_percent=percent,
            tenant_ids=tenant_ids,
        )
        scope = {"tenant_ids": tenant_ids}
        cursor.execute(dashboard_sql.RECENT_BY_MINUTE.format(sample=_sample_clause(percent)), {"since": since, **scope})
        _fill_recent(dash, cursor.fetchall(), scale=100.0 / percent)
        if lag != LAG_WINDOWS[DEFAULT_LAG_WINDOW]:
            _fill_lag(cursor, dash, lag)
        if percent >= 100:
            cursor.execute(dashboard_sql.MISSED_COUNT, {"since": now - MISSED_WINDOW, **scope})
            dash.missed = cursor.fetchone()[0]
        else:
            dash.missed, dash.missed_estimated = sum(dash.states.get("missed", [])), True
        if tenant_ids is None:
            dash.due = _due_next_hour(cursor, now, shards)
            cursor.execute(dashboard_sql.BACKLOG)
            due_envelopes, due_fires, oldest_age, unsettled = cursor.fetchone()
            dash.backlog = {
                "due_envelopes": due_envelopes,
                "due_fires": int(due_fires),
                "oldest_age": max(0.0, float(oldest_age)),
                "unsettled": unsettled,
            }
        cursor.execute(dashboard_sql.DEAD_COUNT, scope)
        dash.dead = cursor.fetchone()[0]
        cursor.execute(dashboard_sql.TENANT_USAGE, {"limit": TENANT_ROWS, **scope})
        for tenant_id, slug, rate, max_running, sent, throttled, running, waited in cursor.fetchall():
            dash.tenants.append(
                {
                    "id": tenant_id,
                    "slug": slug,
                    "rate": rate,
                    "max_running": max_running,
                    "dispatched": sent,
                    "throttled": throttled,
                    "running": running,
                    "throttled_claims": waited,
                    "recent": dash.recent_by_tenant.get(tenant_id, 0),
                    "sent": dash.sent_by_tenant.get(tenant_id, 0),
                }
            )
        # The processes (host names, what each holds for every tenant) are the platform's: not a scoped operator's.
        processes: list[tuple] = []
        running_by_worker: dict[str, int] = {}
        if tenant_ids is None:
            cursor.execute(dashboard_sql.RUNNING_BY_WORKER)
            running_by_worker = dict(cursor.fetchall())
            cursor.execute(dashboard_sql.PROCESSES, {"recent": RECENT_PROCESSES_SECONDS})
            processes = cursor.fetchall()
        for role, name, started_at, age, leases in processes:
            dash.processes.append(
                {
                    "role": role,
                    "name": name,
                    "started_at": started_at,
                    "age": float(age),
                    "live": float(age) <= SILENT_AFTER_SECONDS,
                    "leases": leases if role == "materializer" else running_by_worker.get(name, 0),
                }
            )
    first_page = next(
        stuck_pages(
            since=now - timedelta(days=1),
            until=now,
            now=now,
            stuck_after_seconds=DEFAULT_STUCK_AFTER_SECONDS,
            tenant_ids=tenant_ids,
        ),
        [],
    )
    dash.stuck, dash.stuck_capped = len(first_page), len(first_page) >= STUCK_PAGE
    return dash


def _sample_percent(cursor: Any, since: datetime, until: datetime) -> float:
    """100 below a sample's worth of occurrences in [since, until] (by the planner's estimate), a smaller share
    above."""
    cursor.execute(dashboard_sql.RECENT_ROWS_ESTIMATE, {"since": since, "until": until})
    return _percent_for(float(cursor.fetchone()[0] or 0))


def _percent_for(estimate: float) -> float:
    """The share of `estimate` rows to read: all of them up to SAMPLE_ROWS, about SAMPLE_ROWS above."""
    return 100.0 if estimate <= SAMPLE_ROWS else max(0.01, 100.0 * SAMPLE_ROWS / estimate)


def _lag_series(width: int) -> defaultdict[str, dict[str, list[float | None]]]:
    """lane -> quantile -> one value (or None) per point of a chart `width` points wide."""
    return defaultdict(lambda: {"p50": [None] * width, "p95": [None] * width, "p99": [None] * width})


def _put_lag(lanes: dict[str, dict[str, list[float | None]]], lane: str, point: int, quantiles: tuple) -> None:
    for name, value in zip(("p50", "p95", "p99"), quantiles, strict=True):
        lanes[lane][name][point] = max(0.0, float(value))


def _sample_clause(percent: float) -> str:
    return "" if percent >= 100 else f"TABLESAMPLE SYSTEM ({percent:.4f})"


def _fill_lag(cursor: Any, dash: Dashboard, lag: LagWindow) -> None:
    """The lag chart over another window than the hour, per bucket of lag.bucket_minutes, read apart from the
    hour's other figures (which stay an hour) with a sample of its own: a day is ~200 M rows at full load, a week
    1.4 G. Both bounds are on scheduled_for, the partition key, so only the window's day partitions are read."""
    bucket = timedelta(minutes=lag.bucket_minutes)
    until = min(lag.until or dash.now, dash.now)
    start = lag.since or dash.now - timedelta(minutes=lag.minutes)
    # Buckets start on multiples of the bucket size (date_bin's origin below is midnight UTC of a past day).
    since = start - (start - start.replace(hour=0, minute=0, second=0, microsecond=0)) % bucket
    points = lag.minutes // lag.bucket_minutes + 1 if lag.since is None else math.ceil((until - since) / bucket)
    dash.lag_buckets = [since + bucket * n for n in range(points)]
    percent = _sample_percent(cursor, since, until)
    dash.lag_sample_percent = percent
    cursor.execute(
        dashboard_sql.LAG_BY_BUCKET.format(sample=_sample_clause(percent)),
        {"since": since, "until": until, "bucket": bucket, "tenant_ids": dash.tenant_ids},
    )
    index = {instant: n for n, instant in enumerate(dash.lag_buckets)}
    lanes = _lag_series(len(dash.lag_buckets))
    for instant, lane, p50, p95, p99 in cursor.fetchall():
        if instant in index and p50 is not None:
            _put_lag(lanes, lane, index[instant], (p50, p95, p99))
    dash.lag = dict(lanes)


def _due_next_hour(cursor: Any, now: datetime, shards: int) -> list[tuple[datetime, int]]:
    """Fires due in the next DUE_MINUTES, per minute: materialized ones plus the expanded rules of the cursors."""
    until = now + timedelta(minutes=DUE_MINUTES)
    params = {"now": now, "until": until, "shards": shards}
    cursor.execute(dashboard_sql.DUE_MATERIALIZED, params)
    materialized = cursor.fetchall()
    cursor.execute(dashboard_sql.CURSOR_ROWS_ESTIMATE)
    estimate = float((cursor.fetchone() or [0])[0] or 0)
    if estimate <= SAMPLE_ROWS:
        source, scale = dashboard_sql.DUE_CURSORS_BY_SHARD, 1.0
    else:
        percent = _percent_for(estimate)
        source, scale = dashboard_sql.DUE_CURSORS_SAMPLED.format(percent=f"{percent:.4f}"), 100.0 / percent
    cursor.execute(dashboard_sql.DUE_CURSOR_GROUPS.format(source=source), params)
    return due_per_minute(now, until, materialized, cursor.fetchall(), scale=scale)


def due_per_minute(
    now: datetime,
    until: datetime,
    materialized: Iterable[tuple[datetime, int]],
    cursor_groups: Iterable[tuple[str, str | None, str | None, int | None, datetime, int]],
    *,
    scale: float = 1.0,
) -> list[tuple[datetime, int]]:
    """Per minute, the fires due in [now, until): materialized (minute, fires) as they are, plus each cursor group
    (kind, cron, timezone, every_seconds, first instant, schedules) expanded through its rule and multiplied by its
    schedules.

    Each (cron, zone) is expanded once: its fires in the window, then every group of that rhythm counts the fires
    from its first instant on (a running sum over the fires), so the cost is the distinct rules times their fires in
    the hour, not the schedules. An interval group adds its period to its first fire (DUE_CURSOR_GROUPS bounds the
    groups of a period).
    """
    counts: dict[datetime, float] = defaultdict(float)
    for minute, written in materialized:
        counts[minute] += int(written)
    rhythms: dict[tuple[str, str], list[tuple[datetime, int]]] = defaultdict(list)
    for kind, cron, timezone, every_seconds, first, schedules in cursor_groups:
        if kind == "cron" and cron and timezone:
            rhythms[(cron, timezone)].append((first, int(schedules)))
        elif kind == "interval" and every_seconds:
            step, fire = timedelta(seconds=int(every_seconds)), first
            while fire < until:
                counts[fire.replace(second=0, microsecond=0)] += int(schedules) * scale
                fire += step
        else:
            counts[first.replace(second=0, microsecond=0)] += int(schedules) * scale
    for (cron, timezone), starts in rhythms.items():
        try:
            fires = TimeRule(kind="cron", cron=cron, timezone=timezone).fires_between(now, until)
        except (TimeRuleError, ValueError):
            # A rule the validator would refuse cannot be in a cursor; should one be, the chart goes on without it.
            logger.warning("due chart: cannot expand %r in %s", cron, timezone, extra={"action": "dashboard"})
            continue
        joining = [0] * (len(fires) + 1)
        for first, schedules in starts:
            joining[bisect.bisect_left(fires, first)] += schedules
        sharing = 0
        for index, fire in enumerate(fires):
            sharing += joining[index]
            counts[fire.replace(second=0, microsecond=0)] += sharing * scale
    return sorted((minute, round(total)) for minute, total in counts.items() if round(total) > 0)


def _fill_recent(dash: Dashboard, rows: list[tuple], *, scale: float) -> None:
    index = {minute: n for n, minute in enumerate(dash.minutes)}
    width = len(dash.minutes)
    lag = _lag_series(width)
    states: dict[str, list[int]] = defaultdict(lambda: [0] * width)
    for grouping, minute, lane, state, tenant_id, count, sent, p50, p95, p99 in rows:
        if grouping == 3 and minute in index and p50 is not None:
            _put_lag(lag, lane, index[minute], (p50, p95, p99))
        elif grouping == 5 and minute in index:
            states[state][index[minute]] = round(count * scale)
        elif grouping == 14:
            dash.recent_by_tenant[tenant_id] = round(count * scale)
            dash.sent_by_tenant[tenant_id] = round(sent * scale)
    dash.lag = dict(lag)
    order = list(STATE_COLORS)
    dash.states = {state: states[state] for state in sorted(states, key=lambda s: order.index(s) if s in order else 99)}
