"""Scale-out under fire: 3 materializers, 2 relays and 2 workers on one database during a 20,000-fire burst; one of
each is SIGKILLed mid-burst, and the survivors still deliver and run every fire, each strict fire enqueued in 5 s."""

from __future__ import annotations

import io
import os

import pytest

from dispatch.bench.drain import DrainBenchmark, DrainConfig

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FIRES = int(os.environ.get("SCHEDULER_SCALE_OUT_FIRES", "20000"))


@pytest.mark.exclusive  # its bounds are timings: measured on a box no other test is loading
def test_one_of_each_process_killed_mid_burst_loses_no_fire_and_keeps_the_enqueue_slo():
    out = io.StringIO()
    config = DrainConfig(
        schedules=FIRES,
        tenants=2,
        materializers=3,
        relays=2,
        workers=2,
        kill_one_of_each=True,
        deadline_seconds=120,
        drain_deadline_seconds=400,
        horizon_seconds=30,
    )

    result = DrainBenchmark(config, out=out).run()

    assert sorted(result["killed"]) == ["materializer-1", "relay-1", "worker-1"], out.getvalue()[-3000:]
    assert result["lost"] == 0, result
    assert result["enqueued"] == FIRES, result
    assert result["duplicate_effects"] == 0, result
    assert result["duplicates"] == 0, "one occurrence row per fire"
    assert result["lag_p99_s"] <= 5.0, result
