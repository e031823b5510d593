"""What tests of every tier share: waiting for a condition, and how hard the property tests try."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

# `make test-fast` runs the property tests with a tenth of their examples (the inner loop); `make test`, all of them.
EXAMPLES_SCALE = float(os.environ.get("SCHEDULER_TEST_EXAMPLES_SCALE", "1"))


def examples(count: int) -> int:
    """Hypothesis examples for a property test that asks for `count` in the full suite."""
    return max(10, round(count * EXAMPLES_SCALE))


def poll(predicate: Callable[[], Any], timeout: float, every: float = 0.05) -> bool:
    """Whether `predicate` became true within `timeout` seconds (tried every `every` seconds, and once at the end)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def wait_for(
    predicate: Callable[[], Any], timeout: float = 10.0, what: str = "the condition", every: float = 0.05
) -> None:
    """Wait until `predicate` is true; fail the test, naming `what`, after `timeout` seconds."""
    if not poll(predicate, timeout, every):
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
