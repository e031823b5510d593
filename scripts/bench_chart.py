"""Draws docs/bench-lag.png: the distribution of enqueue lag per benchmark run, ours against a peer.

Input: files of one lag in seconds per line, written by `bench burst --lags-out` and `bench peer-beat
--lags-out`. Needs matplotlib (requirements-bench.txt).
Usage: python scripts/bench_chart.py OUT.png "label=path" ["label=path" ...]
"""

from __future__ import annotations

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def read(path: str) -> list[float]:
    with open(path) as handle:
        return sorted(float(line) for line in handle if line.strip())


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, series = argv[1], [arg.split("=", 1) for arg in argv[2:]]
    figure, axis = plt.subplots(figsize=(9, 5.5), dpi=110)
    for label, path in series:
        lags = read(path)
        if not lags:
            continue
        fractions = [(i + 1) / len(lags) for i in range(len(lags))]
        p99 = lags[int(0.99 * (len(lags) - 1))]
        axis.step(lags, fractions, where="post", label=f"{label} (n={len(lags):,}, p99={p99:.2f} s)")
    axis.axvline(5.0, color="red", linestyle="--", linewidth=1, label="SLO: 5 s")
    axis.set_xscale("symlog", linthresh=1.0)
    axis.set_xlim(left=0)
    axis.set_xlabel("enqueue lag: broker confirmation (or arrival) - scheduled time, seconds (log scale above 1 s)")
    axis.set_ylabel("fraction of fires enqueued")
    axis.set_title("Top-of-hour burst on two cores: cumulative distribution of enqueue lag")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
