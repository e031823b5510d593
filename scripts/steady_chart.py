"""Draws the steady benchmark's chart: enqueue lag (p50, p99 per ten seconds), the sampled start lag p99, the
outbox and, when the series has it, each role's resident memory over the window.

Input: the CSV written by `bench steady --series-out` (one row per outbox sample). Needs matplotlib
(requirements-bench.txt).
Usage: python scripts/steady_chart.py OUT.png SERIES.csv [TITLE]
"""

from __future__ import annotations

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def column(rows: list[dict[str, str]], name: str) -> list[float | None]:
    return [float(row[name]) if row[name] != "" else None for row in rows]


def draw_late_share(axis: plt.Axes, minutes: list[float], rows: list[dict[str, str]]) -> None:
    """The share of the window's envelopes settled 2 s or more after their stamp, so far: the settle-lag p99 target
    holds while it stays under 1 %."""
    readings = [
        (m, total, late)
        for m, total, late in zip(minutes, column(rows, "settled"), column(rows, "settled_late"), strict=True)
        if total is not None and late is not None
    ]
    if not readings:
        return
    _, total_before, late_before = readings[0]
    points = [
        (m, 100 * (late - late_before) / (total - total_before))
        for m, total, late in readings
        if total - total_before > 0
    ]
    if not points:
        return
    share_axis = axis.twinx()
    share_axis.plot(*zip(*points, strict=True), color="#6a1b9a", label="settled 2 s+ late, share so far (%)")
    share_axis.axhline(1.0, color="#6a1b9a", linestyle="--", linewidth=1, label="target: under 1 %")
    share_axis.set_ylabel("% of settled envelopes")
    # The first minute's few envelopes make the share jump; the axis is scaled to where the run ends up.
    share_axis.set_ylim(0, max(2.0, 2.5 * points[-1][1]))
    share_axis.legend(loc="upper right", fontsize=8)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, path = argv[1], argv[2]
    title = argv[3] if len(argv) > 3 else "bench steady"
    with open(path, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if float(row["at_s"]) >= 0]
    minutes = [float(row["at_s"]) / 60 for row in rows]
    memory_columns = [name for name in (rows[0] if rows else {}) if name.endswith("_rss_mb")]
    panels = 3 if memory_columns else 2
    figure, axes = plt.subplots(panels, 1, figsize=(10, 3.25 * panels), dpi=110, sharex=True)
    lag_axis, outbox_axis = axes[0], axes[1]
    for name, label, style in (("lag_p99_s", "p99", "-"), ("lag_p50_s", "p50", ":")):
        values = column(rows, name)
        points = [(m, v) for m, v in zip(minutes, values, strict=True) if v is not None]
        if points:
            lag_axis.plot(*zip(*points, strict=True), style, color="#1f4e9c", label=f"enqueue lag {label}")
    started = [(m, v) for m, v in zip(minutes, column(rows, "start_lag_p99_s"), strict=True) if v is not None]
    if started:
        lag_axis.plot(*zip(*started, strict=True), "-", color="#ef6c00", label="start lag p99 (sampled)")
    lag_axis.axhline(1.0, color="#b22222", linestyle="--", linewidth=1, label="target: enqueue p99 1 s")
    lag_axis.axhline(5.0, color="#ef6c00", linestyle="--", linewidth=1, label="target: start p99 5 s")
    lag_axis.set_ylabel("seconds (per 10 s of due time)")
    lag_axis.set_yscale("symlog", linthresh=0.1)
    lag_axis.set_ylim(bottom=0)
    lag_axis.legend(loc="upper right", fontsize=8)
    lag_axis.grid(True, alpha=0.3)
    outbox_axis.plot(minutes, column(rows, "outbox_rows"), color="#2e7d32", label="outbox rows")
    outbox_axis.plot(minutes, column(rows, "unsettled"), color="#ef6c00", label="confirmed, not settled")
    outbox_axis.set_ylabel("envelopes")
    outbox_axis.legend(loc="upper left", fontsize=8)
    if rows and "settled_late" in rows[0]:  # written by the benchmark since it samples the settle histogram
        draw_late_share(outbox_axis, minutes, rows)
    outbox_axis.grid(True, alpha=0.3)
    if memory_columns:  # written by the benchmark since it samples each role's memory into the series
        memory_axis = axes[2]
        for name in memory_columns:
            points = [(m, v) for m, v in zip(minutes, column(rows, name), strict=True) if v is not None]
            if points:
                memory_axis.plot(*zip(*points, strict=True), label=name.removesuffix("_rss_mb"))
        memory_axis.axvline(5.0, color="#777777", linestyle=":", linewidth=1, label="growth measured from here")
        memory_axis.set_ylabel("resident MiB")
        memory_axis.legend(loc="upper left", fontsize=8)
        memory_axis.grid(True, alpha=0.3)
    axes[-1].set_xlabel("minutes into the window")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
