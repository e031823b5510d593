"""The console dashboard (the admin index): the questions an operator asks first, as charts drawn server-side.

Charts are inline SVG built here, with no script and nothing fetched from elsewhere: the console works offline.
Every figure comes from PostgreSQL at page load (dispatch/sql/dashboard.py says how each read stays bounded).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from dispatch.sql import DB_NOW
from dispatch.sql import dashboard as dashboard_sql
from dispatch.stuck import DEFAULT_STUCK_AFTER_SECONDS, STUCK_PAGE, stuck_pages
from schedules.cron_syntax import TimeRuleError
from schedules.timerules import TimeRule

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
LANE_COLORS = {"strict": ("#1565c0", "#42a5f5", "#90caf9"), "flexible": ("#2e7d32", "#66bb6a", "#a5d6a7")}


@dataclass(frozen=True)
class LagWindow:
    """A span the lag chart can cover: its bucket keeps the chart near 60-100 points, its labels one per `label_every`
    buckets (every 10 minutes, hourly, every 4 hours)."""

    key: str
    title: str
    minutes: int
    bucket_minutes: int
    label_every: int


LAG_WINDOWS = {
    window.key: window
    for window in (
        LagWindow("1h", "last hour", 60, 1, 10),
        LagWindow("6h", "last 6 hours", 360, 5, 12),
        LagWindow("24h", "last 24 hours", 1440, 15, 16),
    )
}
DEFAULT_LAG_WINDOW = "1h"


def lag_window(value: Any) -> LagWindow:
    """The window a query parameter asks for; anything else (absent, misspelt, a list) is the default hour."""
    return LAG_WINDOWS.get(value if isinstance(value, str) else "", LAG_WINDOWS[DEFAULT_LAG_WINDOW])


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
    dead: int = 0
    stuck: int = 0
    stuck_capped: bool = False
    tenants: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)

    # --- charts ------------------------------------------------------------------------------------------------

    def lag_chart(self) -> SafeString:
        series = []
        for lane, quantiles in sorted(self.lag.items()):
            colors = LANE_COLORS.get(lane, ("#444", "#777", "#aaa"))
            for (quantile, values), color in zip(sorted(quantiles.items(), reverse=True), colors, strict=False):
                series.append((f"{lane} {quantile}", color, values))
        return line_chart(
            series,
            self.lag_buckets or self.minutes,
            unit="s",
            empty=f"No fire was enqueued in the {self.lag_window.title} yet.",
            label_every=self.lag_window.label_every,
        )

    def lag_choices(self) -> list[dict[str, Any]]:
        return [{"key": w.key, "title": w.key, "selected": w == self.lag_window} for w in LAG_WINDOWS.values()]

    def states_chart(self) -> SafeString:
        stacks = [(state, STATE_COLORS.get(state, "#999"), counts) for state, counts in self.states.items()]
        return stacked_bars(stacks, self.minutes, empty="No fire was due in the last hour yet.")

    def due_chart(self) -> SafeString:
        start = self.now.replace(second=0, microsecond=0)
        return bar_chart(self.due, start=start, empty="Nothing falls due in the next hour.")


def build(*, shards: int | None = None, lag: LagWindow | None = None) -> Dashboard:
    shards = shards or settings.SCHEDULER_SHARDS
    lag = lag or LAG_WINDOWS[DEFAULT_LAG_WINDOW]
    with connection.cursor() as cursor:
        cursor.execute(DB_NOW)
        now = cursor.fetchone()[0]
        since = (now - timedelta(minutes=WINDOW_MINUTES)).replace(second=0, microsecond=0)
        minutes = [since + timedelta(minutes=n) for n in range(WINDOW_MINUTES + 1)]
        percent = _sample_percent(cursor, since)
        dash = Dashboard(now=now, sample_percent=percent, minutes=minutes, lag_window=lag, lag_sample_percent=percent)
        cursor.execute(dashboard_sql.RECENT_BY_MINUTE.format(sample=_sample_clause(percent)), {"since": since})
        _fill_recent(dash, cursor.fetchall(), scale=100.0 / percent)
        if lag.minutes != WINDOW_MINUTES:
            _fill_lag(cursor, dash, lag)
        dash.due = _due_next_hour(cursor, now, shards)
        cursor.execute(dashboard_sql.BACKLOG)
        due_envelopes, due_fires, oldest_age, unsettled = cursor.fetchone()
        dash.backlog = {
            "due_envelopes": due_envelopes,
            "due_fires": int(due_fires),
            "oldest_age": max(0.0, float(oldest_age)),
            "unsettled": unsettled,
        }
        cursor.execute(dashboard_sql.DEAD_COUNT)
        dash.dead = cursor.fetchone()[0]
        cursor.execute(dashboard_sql.TENANT_USAGE, {"limit": TENANT_ROWS})
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
        cursor.execute(dashboard_sql.RUNNING_BY_WORKER)
        running_by_worker = dict(cursor.fetchall())
        cursor.execute(dashboard_sql.PROCESSES, {"recent": RECENT_PROCESSES_SECONDS})
        for role, name, started_at, age, leases in cursor.fetchall():
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
        stuck_pages(since=now - timedelta(days=1), until=now, now=now, stuck_after_seconds=DEFAULT_STUCK_AFTER_SECONDS),
        [],
    )
    dash.stuck, dash.stuck_capped = len(first_page), len(first_page) >= STUCK_PAGE
    return dash


def _sample_percent(cursor: Any, since: datetime) -> float:
    """100 below a sample's worth of occurrences since `since` (by the planner's estimate), a smaller share above."""
    cursor.execute(dashboard_sql.RECENT_ROWS_ESTIMATE, {"since": since})
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
    """The lag chart over a longer window than the hour, per bucket of lag.bucket_minutes, read apart from the
    hour's other figures (which stay an hour) with a sample of its own: a day is ~200 M rows at full load."""
    bucket = timedelta(minutes=lag.bucket_minutes)
    start = dash.now - timedelta(minutes=lag.minutes)
    # Buckets start on multiples of the bucket size (date_bin's origin below is midnight UTC of a past day).
    since = start - (start - start.replace(hour=0, minute=0, second=0, microsecond=0)) % bucket
    dash.lag_buckets = [since + bucket * n for n in range(lag.minutes // lag.bucket_minutes + 1)]
    percent = _sample_percent(cursor, since)
    dash.lag_sample_percent = percent
    cursor.execute(
        dashboard_sql.LAG_BY_BUCKET.format(sample=_sample_clause(percent)),
        {"since": since, "bucket": bucket},
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


# --- SVG --------------------------------------------------------------------------------------------------------

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 560, 190, 44, 22, 8


def _frame(max_value: float, unit: str, x_labels: list[tuple[float, str]], *, counts: bool = False) -> list[str]:
    """Axes, three horizontal grid lines with their values (whole numbers for counts), and the x labels."""
    plot_h = HEIGHT - BOTTOM - TOP
    parts = []
    for fraction in (0.0, 0.5, 1.0):
        y = TOP + plot_h * (1 - fraction)
        value = max_value * fraction
        if counts or max_value >= 10:
            label = f"{value:,.0f}{unit}"
        else:
            label = f"{value:.{2 if max_value >= 0.1 else 3}f}{unit}"
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{escape(label)}</text>')
    for x, text in x_labels:
        # A label at the right edge would be cut in half: it ends there instead.
        anchor = "end" if x > WIDTH - 20 else "middle"
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 6}" text-anchor="{anchor}" class="tick">{escape(text)}</text>')
    return parts


def _legend(items: list[tuple[str, str]]) -> list[str]:
    """Colour keys along the top of the plot, wrapping to a new row where the chart ends."""
    parts, x, y = [], LEFT + 6.0, float(TOP + 2)
    for name, color in items:
        width = 18 + 6.5 * len(name)
        if x + width > WIDTH and x > LEFT + 6:
            x, y = LEFT + 6.0, y + 12
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="8" height="8" fill="{color}"/>')
        parts.append(f'<text x="{x + 11:.1f}" y="{y + 8:.1f}" class="legend">{escape(name)}</text>')
        x += width
    return parts


def _svg(parts: list[str], title: str) -> SafeString:
    """Every text inside `parts` went through escape(); numbers and colours are ours."""
    body = "".join(parts)
    return mark_safe(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">{body}</svg>'
    )


def _empty(message: str) -> SafeString:
    return mark_safe(f'<p class="chart-empty">{escape(message)}</p>')


def _time_labels(minutes: list[datetime], every: int = 10) -> list[tuple[float, str]]:
    """A label on each point at a round time of the clock: every `every` points' worth of time since midnight UTC
    (every 10 minutes on a chart of minutes, every hour on one of 5-minute buckets), whatever instant it starts at."""
    plot_w = WIDTH - LEFT
    step = plot_w / max(1, len(minutes) - 1)
    spacing = (minutes[1] - minutes[0]) * every if len(minutes) > 1 else timedelta(minutes=every)
    return [
        (LEFT + n * step, minute.astimezone(UTC).strftime("%H:%M"))
        for n, minute in enumerate(minutes)
        if (minute - minute.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)) % spacing
        == timedelta(0)
    ]


def line_chart(
    series: list[tuple[str, str, list[float | None]]],
    minutes: list[datetime],
    *,
    unit: str,
    empty: str,
    label_every: int = 10,
) -> SafeString:
    values = [v for _, _, points in series for v in points if v is not None]
    if not values:
        return _empty(empty)
    top = max(values) * 1.1 or 1.0
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM - TOP
    step = plot_w / max(1, len(minutes) - 1)
    parts = _frame(top, unit, _time_labels(minutes, label_every))
    for _, color, points in series:
        coords = [
            f"{LEFT + n * step:.1f},{TOP + plot_h * (1 - v / top):.1f}" for n, v in enumerate(points) if v is not None
        ]
        if len(coords) == 1:
            x, y = coords[0].split(",")
            parts.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>')
        elif coords:
            parts.append(f'<polyline points="{" ".join(coords)}" fill="none" stroke="{color}" stroke-width="1.6"/>')
    parts += _legend([(name, color) for name, color, _ in series])
    return _svg(parts, "enqueue lag per lane")


def stacked_bars(stacks: list[tuple[str, str, list[int]]], minutes: list[datetime], *, empty: str) -> SafeString:
    totals = [sum(counts[n] for _, _, counts in stacks) for n in range(len(minutes))]
    if not any(totals):
        return _empty(empty)
    top = float(max(2, math.ceil(max(totals) * 1.1)))
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM - TOP
    bar_w = plot_w / len(minutes)
    parts = _frame(top, "", _time_labels(minutes), counts=True)
    for n in range(len(minutes)):
        y = float(TOP + plot_h)
        for state, color, counts in stacks:
            if counts[n]:
                h = plot_h * counts[n] / top
                y -= h
                parts.append(
                    f'<rect x="{LEFT + n * bar_w:.1f}" y="{y:.1f}" width="{max(1.0, bar_w - 1):.1f}" height="{h:.1f}"'
                    f' fill="{color}"><title>{escape(state)}: {counts[n]}</title></rect>'
                )
    parts += _legend([(state, color) for state, color, _ in stacks])
    return _svg(parts, "fires per minute by state")


def bar_chart(points: list[tuple[datetime, int]], *, start: datetime, empty: str) -> SafeString:
    if not points:
        return _empty(empty)
    minutes = [start + timedelta(minutes=n) for n in range(DUE_MINUTES + 1)]
    by_minute = dict(points)
    counts = [by_minute.get(minute, 0) for minute in minutes]
    top = float(max(2, math.ceil(max(counts) * 1.1)))
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM - TOP
    bar_w = plot_w / len(minutes)
    parts = _frame(top, "", _time_labels(minutes), counts=True)
    for n, count in enumerate(counts):
        if count:
            h = plot_h * count / top
            parts.append(
                f'<rect x="{LEFT + n * bar_w:.1f}" y="{TOP + plot_h - h:.1f}" width="{max(1.0, bar_w - 1):.1f}"'
                f' height="{h:.1f}" fill="#1565c0"><title>{minutes[n]:%H:%M} UTC: {count} fires</title></rect>'
            )
    return _svg(parts, "fires due in the next 60 minutes")
