"""Each tenant's share of a worker process's handler threads: how many of its handlers may run here at once, and
whether the ones running are slow enough that more of its work should not be taken now.

A handler cannot be preempted, and how long it will run is known only afterwards. So the share is a cap on handlers
actually in flight, whatever their speed: at most `cap` threads of the pool (SCHEDULER_WORKER_TENANT_SHARE of them)
run one tenant's handlers at a time, and the rest stay free for everyone else. A tenant whose fast handlers come and
go loses nothing by it (a noop envelope is done in milliseconds on any number of threads); a tenant whose handlers
hang holds at most its share, until their deadlines. A handler that has run longer than the envelope slice counts
as slow: while a tenant's share (or the whole pool) is held by slow handlers, new work for it is not claimed here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Slot:
    """One pool thread running (or about to run) handlers of `tenant`; `busy_since` is when its current handler
    started (None between handlers)."""

    tenant: int | None
    busy_since: float | None = None

    def begin(self, now: float) -> None:
        self.busy_since = now

    def end(self) -> None:
        self.busy_since = None


@dataclass
class PoolShare:
    threads: int
    share: float
    clock: Callable[[], float] = time.monotonic
    _slots: dict[int | None, set[Slot]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def cap(self) -> int:
        """Threads one tenant's handlers may hold at once (at least one)."""
        return max(1, int(self.threads * self.share))

    def acquire(self, tenant: int | None) -> Slot | None:
        """A slot for a thread about to run `tenant`'s handlers, or None when the tenant holds its share already."""
        with self._lock:
            held = self._slots.setdefault(tenant, set())
            if len(held) >= self.cap:
                return None
            slot = Slot(tenant)
            held.add(slot)
            return slot

    def release(self, slot: Slot) -> None:
        with self._lock:
            held = self._slots.get(slot.tenant)
            if held is not None:
                held.discard(slot)
                if not held:
                    del self._slots[slot.tenant]

    def free(self, tenant: int | None) -> int:
        """Slots `tenant` may take now."""
        with self._lock:
            return max(0, self.cap - len(self._slots.get(tenant, ())))

    def busy(self, tenant: int | None) -> str:
        """Why `tenant`'s handlers cannot start here right now, in words."""
        if not self.free(tenant):
            return f"its share of the worker's pool ({self.cap} of {self.threads} threads) is in use"
        return f"every thread of the worker's pool ({self.threads}) is in use"

    def blocked(self, tenant: int | None, slow_after: float) -> str | None:
        """Why no handler of `tenant` can start here soon, or None: its share, or every thread of the pool, is held
        by handlers that have run `slow_after` seconds or more (they will not be done in a moment)."""
        now = self.clock()
        with self._lock:
            slow_mine = sum(1 for slot in self._slots.get(tenant, ()) if _slow(slot, now, slow_after))
            if slow_mine >= self.cap:
                return f"its share of the worker's pool ({self.cap} of {self.threads} threads) is held by slow handlers"
            slow_all = sum(1 for held in self._slots.values() for slot in held if _slow(slot, now, slow_after))
            if slow_all >= self.threads:
                return f"every thread of the worker's pool ({self.threads}) is held by slow handlers"
        return None


def _slow(slot: Slot, now: float, slow_after: float) -> bool:
    return slot.busy_since is not None and now - slot.busy_since >= slow_after
