"""Draws the steady benchmark's chart: enqueue lag (p50, p99 per ten seconds), the sampled start lag p99 and the
outbox over the window.

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


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, path = argv[1], argv[2]
    title = argv[3] if len(argv) > 3 else "bench steady"
    with open(path, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if float(row["at_s"]) >= 0]
    minutes = [float(row["at_s"]) / 60 for row in rows]
    figure, (lag_axis, outbox_axis) = plt.subplots(2, 1, figsize=(10, 6.5), dpi=110, sharex=True)
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
    outbox_axis.set_xlabel("minutes into the window")
    outbox_axis.legend(loc="upper right", fontsize=8)
    outbox_axis.grid(True, alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
