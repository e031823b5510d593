"""A tenant's share of a worker process's handler threads (dispatch/engine/pool_share.py), on a driven clock."""

from __future__ import annotations

from dispatch.engine.pool_share import PoolShare


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_tenant_holds_at_most_its_share_of_the_threads_and_the_rest_stay_free_for_others():
    share = PoolShare(8, 0.5)
    slots = [share.acquire(1) for _ in range(4)]

    assert all(slots)
    assert share.acquire(1) is None, "four of eight threads is tenant 1's share"
    assert share.free(1) == 0
    assert share.free(2) == 4
    assert share.acquire(2) is not None

    share.release(slots[0])  # type: ignore[arg-type]
    assert share.free(1) == 1
    assert share.acquire(1) is not None


def test_the_share_is_at_least_one_thread():
    assert PoolShare(1, 0.5).cap == 1
    assert PoolShare(3, 0.1).cap == 1
    assert PoolShare(16, 0.25).cap == 4


def test_a_tenant_is_blocked_only_while_its_whole_share_runs_handlers_slower_than_the_turn():
    clock = Clock()
    share = PoolShare(4, 0.5, clock=clock)
    first, second = share.acquire(1), share.acquire(1)
    assert first is not None and second is not None
    first.begin(clock.now)
    second.begin(clock.now)

    assert share.blocked(1, slow_after=1.0) is None, "just started: they may be done in a moment"
    clock.now += 1.0
    assert "share of the worker's pool (2 of 4 threads) is held by slow handlers" in (share.blocked(1, 1.0) or "")
    assert share.blocked(2, 1.0) is None, "another tenant still has its own share"

    second.end()  # between two handlers: a fast tenant's thread is not slow
    assert share.blocked(1, 1.0) is None


def test_a_pool_whose_every_thread_runs_slow_handlers_blocks_every_tenant():
    clock = Clock()
    share = PoolShare(4, 0.5, clock=clock)
    for tenant in (1, 1, 2, 2):
        slot = share.acquire(tenant)
        assert slot is not None
        slot.begin(clock.now)
    clock.now += 5

    assert "every thread of the worker's pool (4) is held by slow handlers" in (share.blocked(3, 1.0) or "")
    assert "is in use" in share.busy(3)
