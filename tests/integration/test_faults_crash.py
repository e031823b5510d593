"""The crash-point matrix in CI: every hand-off of materializer, relay and worker, killed there and restarted, loses
no fire and leaves one business effect per occurrence."""

from __future__ import annotations

import os

import pytest

from dispatch.bench.crash_matrix import CrashMatrix, table
from dispatch.engine.faults import POINTS

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.django_db(transaction=True)]

# The bar for CI: at least ten deaths at every point.
ITERATIONS = int(os.environ.get("SCHEDULER_CRASH_ITERATIONS", "10"))


@pytest.mark.parametrize("point", POINTS)
def test_a_process_killed_at_this_point_loses_nothing_and_duplicates_no_effect(tenants, point):
    results = CrashMatrix(fires=5, seed=hash(point) % 1000).run(points=(point,), iterations=ITERATIONS)

    (result,) = results
    print(table(results))
    assert result.runs == ITERATIONS
    assert result.reached >= ITERATIONS // 2, f"the process died at {point} in only {result.reached} runs"
    assert result.lost == 0, result.notes
    assert result.duplicate_effects == 0, result.notes
    assert result.unclean_reconciles == 0, result.notes
