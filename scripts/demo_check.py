"""End-to-end check against a running demo (make demo): N one-offs due at one instant, created through the API.

Usage: .venv/bin/python scripts/demo_check.py --token <demo token> [--count 40] [--lead 20]
Prints the lag figures (enqueued_at - scheduled_for) and whether every fire succeeded exactly once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta


def call(base: str, host: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        base + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Host": host, "Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def parse(instant: str) -> datetime:
    return datetime.fromisoformat(instant.replace("Z", "+00:00"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--token", required=True)
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--lead", type=float, default=20.0, help="seconds from now to the shared instant")
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--host", default="demo.localhost")
    args = parser.parse_args()

    run_at = (datetime.now(UTC) + timedelta(seconds=args.lead)).replace(microsecond=0)
    ids = []
    for n in range(args.count):
        body = {"name": f"burst-{run_at:%H%M%S}-{n}", "kind": "once", "run_at": run_at.isoformat(), "handler": "noop"}
        ids.append(call(args.base, args.host, args.token, "POST", "/api/v1/schedules/", body)["id"])
    print(f"created {len(ids)} one-offs due at {run_at.isoformat()}")
    deadline = time.monotonic() + args.lead + 60
    while True:
        occurrences = [
            call(args.base, args.host, args.token, "GET", f"/api/v1/schedules/{sid}/occurrences/")["results"]
            for sid in ids
        ]
        done = sum(1 for occ in occurrences if len(occ) == 1 and occ[0]["state"] == "succeeded")
        if done == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(2)
    lags, early, multiple = [], 0, 0
    for occ in occurrences:
        multiple += len(occ) > 1
        for o in occ:
            if o["enqueued_at"]:
                lag = (parse(o["enqueued_at"]) - parse(o["scheduled_for"])).total_seconds()
                lags.append(lag)
                early += lag < 0
    lags.sort()
    p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else None
    report = {
        "schedules": len(ids),
        "succeeded_once": done,
        "with_more_than_one_occurrence": multiple,
        "enqueued_before_time": early,
        "lag_p50_s": round(statistics.median(lags), 3) if lags else None,
        "lag_p99_s": round(p99, 3) if p99 is not None else None,
        "lag_max_s": round(lags[-1], 3) if lags else None,
    }
    print(json.dumps(report))
    return 0 if done == len(ids) and not early and not multiple else 1


if __name__ == "__main__":
    sys.exit(main())
