"""The console dashboard's charts: inline SVG drawn on the server, with no script and nothing fetched from
elsewhere, so the console works offline. Every text put in a chart goes through escape().

Each chart keeps its legend in a band above the plot, never over the data; a line is told apart by its dash
pattern as well as its colour (a reader who cannot tell the colours apart still can), and a series without a
point in the range says so in the legend instead of silently missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, PLOT_HEIGHT, LEFT, BOTTOM, TOP = 560, 160, 44, 22, 8
# One row of the legend band; its keys wrap to a new row where the chart ends.
LEGEND_ROW = 14
NO_DATA = "no data in this range"


@dataclass(frozen=True)
class Series:
    """One line: its name in the legend, its colour and SVG dash pattern ("" is solid), one value (or None) per
    point of the x axis."""

    name: str
    color: str
    values: list[float | None]
    dash: str = ""

    @property
    def has_data(self) -> bool:
        return any(value is not None for value in self.values)


@dataclass(frozen=True)
class LegendKey:
    """A legend entry: a short line in the series' colour and dash (or a filled square, for bars), its name, and a
    note such as NO_DATA."""

    name: str
    color: str
    dash: str = ""
    square: bool = False
    note: str = ""

    @property
    def text(self) -> str:
        return f"{self.name}: {self.note}" if self.note else self.name


def _key_width(key: LegendKey) -> float:
    """The key's mark and the gap before its text: a square for bars, a short stretch of line for lines."""
    return 12 if key.square else 22


def legend_rows(keys: list[LegendKey]) -> list[list[tuple[float, LegendKey]]]:
    """The keys laid out left to right from the plot's left edge, wrapping at the chart's width: rows of (x, key)."""
    rows: list[list[tuple[float, LegendKey]]] = [[]]
    x = float(LEFT)
    for key in keys:
        width = _key_width(key) + 8 + 6.2 * len(key.text)
        if x + width > WIDTH and rows[-1]:
            rows.append([])
            x = float(LEFT)
        rows[-1].append((x, key))
        x += width
    return rows if rows[0] else []


def _legend(keys: list[LegendKey]) -> tuple[list[str], float]:
    """The legend band's SVG and its height: the plot starts below it."""
    parts = []
    rows = legend_rows(keys)
    for number, row in enumerate(rows):
        y = 2 + number * LEGEND_ROW
        for x, key in row:
            if key.square:
                parts.append(f'<rect x="{x:.1f}" y="{y + 2}" width="8" height="8" fill="{key.color}"/>')
            else:
                dash = f' stroke-dasharray="{key.dash}"' if key.dash else ""
                parts.append(
                    f'<line x1="{x:.1f}" y1="{y + 6}" x2="{x + 18:.1f}" y2="{y + 6}" stroke="{key.color}"'
                    f' stroke-width="2"{dash}/>'
                )
            quiet = " no-data" if key.note == NO_DATA else ""
            text_x = x + _key_width(key)
            parts.append(f'<text x="{text_x:.1f}" y="{y + 10}" class="legend{quiet}">{escape(key.text)}</text>')
    return parts, len(rows) * LEGEND_ROW + (4 if rows else 0)


def _frame(
    max_value: float, unit: str, x_labels: list[tuple[float, str]], *, top: float, counts: bool = False
) -> list[str]:
    """Axes, three horizontal grid lines with their values (whole numbers for counts), and the x labels, for a plot
    whose top edge is at `top`."""
    parts = []
    for fraction in (0.0, 0.5, 1.0):
        y = top + PLOT_HEIGHT * (1 - fraction)
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
        y = top + PLOT_HEIGHT + BOTTOM - 6
        parts.append(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="tick">{escape(text)}</text>')
    return parts


def _svg(parts: list[str], title: str, height: float) -> SafeString:
    """Every text inside `parts` went through escape(); numbers and colours are ours."""
    body = "".join(parts)
    return mark_safe(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {height:.0f}" role="img" aria-label="{escape(title)}">{body}</svg>'
    )


def _empty(message: str) -> SafeString:
    return mark_safe(f'<p class="chart-empty">{escape(message)}</p>')


def _time_labels(minutes: list[datetime], every: int = 10, label_format: str = "%H:%M") -> list[tuple[float, str]]:
    """A label on each point at a round time of the clock: every `every` points' worth of time since midnight UTC
    (every 10 minutes on a chart of minutes, every hour on one of 5-minute buckets, each day on a week of 2-hour
    buckets), whatever instant it starts at."""
    plot_w = WIDTH - LEFT
    step = plot_w / max(1, len(minutes) - 1)
    spacing = (minutes[1] - minutes[0]) * every if len(minutes) > 1 else timedelta(minutes=every)
    return [
        (LEFT + n * step, minute.astimezone(UTC).strftime(label_format))
        for n, minute in enumerate(minutes)
        if (minute - minute.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)) % spacing
        == timedelta(0)
    ]


def line_chart(
    series: list[Series],
    minutes: list[datetime],
    *,
    unit: str,
    empty: str,
    title: str,
    label_every: int = 10,
    label_format: str = "%H:%M",
) -> SafeString:
    """Lines over time; `empty` instead when no series has a point. A series without one is named in the legend
    with NO_DATA."""
    values = [v for line in series for v in line.values if v is not None]
    if not values:
        return _empty(empty)
    legend, band = _legend(
        [LegendKey(line.name, line.color, line.dash, note="" if line.has_data else NO_DATA) for line in series]
    )
    top_value = max(values) * 1.1 or 1.0
    plot_top = band + TOP
    step = (WIDTH - LEFT) / max(1, len(minutes) - 1)
    parts = legend + _frame(top_value, unit, _time_labels(minutes, label_every, label_format), top=plot_top)
    for line in series:
        coords = [
            (LEFT + n * step, plot_top + PLOT_HEIGHT * (1 - v / top_value))
            for n, v in enumerate(line.values)
            if v is not None
        ]
        tip = f"<title>{escape(line.name)}</title>"
        if len(coords) == 1:
            (x, y) = coords[0]
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{line.color}">{tip}</circle>')
        elif coords:
            points = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            dash = f' stroke-dasharray="{line.dash}"' if line.dash else ""
            parts.append(
                f'<polyline points="{points}" fill="none" stroke="{line.color}" stroke-width="1.8"{dash}>'
                f"{tip}</polyline>"
            )
    return _svg(parts, title, plot_top + PLOT_HEIGHT + BOTTOM)


def stacked_bars(
    stacks: list[tuple[str, str, list[int]]], minutes: list[datetime], *, empty: str, title: str
) -> SafeString:
    totals = [sum(counts[n] for _, _, counts in stacks) for n in range(len(minutes))]
    if not any(totals):
        return _empty(empty)
    legend, band = _legend([LegendKey(state, color, square=True) for state, color, _ in stacks])
    top_value = float(max(2, math.ceil(max(totals) * 1.1)))
    plot_top = band + TOP
    bar_w = (WIDTH - LEFT) / len(minutes)
    parts = legend + _frame(top_value, "", _time_labels(minutes), top=plot_top, counts=True)
    for n in range(len(minutes)):
        y = float(plot_top + PLOT_HEIGHT)
        for state, color, counts in stacks:
            if counts[n]:
                h = PLOT_HEIGHT * counts[n] / top_value
                y -= h
                parts.append(
                    f'<rect x="{LEFT + n * bar_w:.1f}" y="{y:.1f}" width="{max(1.0, bar_w - 1):.1f}" height="{h:.1f}"'
                    f' fill="{color}"><title>{escape(state)}: {counts[n]}</title></rect>'
                )
    return _svg(parts, title, plot_top + PLOT_HEIGHT + BOTTOM)


def bar_chart(points: list[tuple[datetime, int]], *, start: datetime, minutes: int, empty: str) -> SafeString:
    if not points:
        return _empty(empty)
    instants = [start + timedelta(minutes=n) for n in range(minutes + 1)]
    by_minute = dict(points)
    counts = [by_minute.get(minute, 0) for minute in instants]
    top_value = float(max(2, math.ceil(max(counts) * 1.1)))
    bar_w = (WIDTH - LEFT) / len(instants)
    parts = _frame(top_value, "", _time_labels(instants), top=TOP, counts=True)
    for n, count in enumerate(counts):
        if count:
            h = PLOT_HEIGHT * count / top_value
            parts.append(
                f'<rect x="{LEFT + n * bar_w:.1f}" y="{TOP + PLOT_HEIGHT - h:.1f}" width="{max(1.0, bar_w - 1):.1f}"'
                f' height="{h:.1f}" fill="#1565c0"><title>{instants[n]:%H:%M} UTC: {count} fires</title></rect>'
            )
    return _svg(parts, f"fires due in the next {minutes} minutes", TOP + PLOT_HEIGHT + BOTTOM)
