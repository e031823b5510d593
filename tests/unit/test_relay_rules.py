"""The settler's batch size follows how long its statements take; refused publishes are logged once per queue; the
relay's lease outlasts its publishes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from dispatch.engine.publishing import QueueRefusals
from dispatch.engine.settler import SETTLE_TARGET_SECONDS, next_batch_size


def test_a_full_batch_that_was_quick_doubles_up_to_the_bound():
    assert next_batch_size(20, settled=20, seconds=SETTLE_TARGET_SECONDS / 4, most=500) == 40
    assert next_batch_size(400, settled=400, seconds=0.001, most=500) == 500


def test_a_batch_that_was_not_full_teaches_nothing_about_a_bigger_one():
    assert next_batch_size(20, settled=3, seconds=0.001, most=500) == 20


def test_a_slow_statement_halves_the_batch_but_never_below_one():
    assert next_batch_size(40, settled=40, seconds=SETTLE_TARGET_SECONDS * 3, most=500) == 20
    assert next_batch_size(1, settled=1, seconds=5.0, most=500) == 1


def test_a_statement_near_the_target_keeps_its_size():
    assert next_batch_size(40, settled=40, seconds=SETTLE_TARGET_SECONDS, most=500) == 40


def test_refusals_are_logged_once_per_queue_until_it_accepts_again(caplog):
    refusals = QueueRefusals()
    with caplog.at_level(logging.WARNING, logger="dispatch.engine.publishing"):
        for _ in range(20):
            refusals.refused("strict", RuntimeError("nack"))
        refusals.refused("other", RuntimeError("returned"))
        refusals.accepted("flexible")  # never refused: nothing to say
        refusals.accepted("strict")
        refusals.accepted("strict")
    lines = [record.getMessage() for record in caplog.records]
    assert sum("refuses publishes to strict" in line for line in lines) == 1
    assert sum("strict accepts publishes again after 20 refused publishes" in line for line in lines) == 1
    assert refusals.refusing() == {"other": 1}
    assert len(lines) == 3


def test_a_relay_lease_shorter_than_the_staging_lead_plus_the_publish_timeout_stops_start_up():
    """A live relay would lose the envelopes it is still publishing: the settings refuse it, naming the variables."""
    env = {
        **os.environ,
        "SCHEDULER_RELAY_LEASE_SECONDS": "5",
        "SCHEDULER_RELAY_PUBLISH_TIMEOUT_SECONDS": "10",
    }
    done = subprocess.run(
        [sys.executable, "-c", "import scheduler_project.settings"],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "SCHEDULER_RELAY_LEASE_SECONDS=5 must exceed" in done.stderr
