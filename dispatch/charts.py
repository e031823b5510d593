"""The console dashboard's charts: inline SVG drawn on the server, with no script and nothing fetched from
elsewhere, so the console works offline. Every text put in a chart goes through escape()."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

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


def bar_chart(points: list[tuple[datetime, int]], *, start: datetime, minutes: int, empty: str) -> SafeString:
    if not points:
        return _empty(empty)
    instants = [start + timedelta(minutes=n) for n in range(minutes + 1)]
    by_minute = dict(points)
    counts = [by_minute.get(minute, 0) for minute in instants]
    top = float(max(2, math.ceil(max(counts) * 1.1)))
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM - TOP
    bar_w = plot_w / len(instants)
    parts = _frame(top, "", _time_labels(instants), counts=True)
    for n, count in enumerate(counts):
        if count:
            h = plot_h * count / top
            parts.append(
                f'<rect x="{LEFT + n * bar_w:.1f}" y="{TOP + plot_h - h:.1f}" width="{max(1.0, bar_w - 1):.1f}"'
                f' height="{h:.1f}" fill="#1565c0"><title>{instants[n]:%H:%M} UTC: {count} fires</title></rect>'
            )
    return _svg(parts, f"fires due in the next {minutes} minutes")
