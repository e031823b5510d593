"""The shape every long-running process shares: step until idle, sleep on a monotonic clock, stop on a signal."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)


class StopFlag:
    """Set by SIGTERM/SIGINT; sleeping processes wake at once instead of finishing their nap."""

    def __init__(self) -> None:
        self._event = threading.Event()

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self, *_: object) -> None:
        self._event.set()

    def sleep(self, seconds: float) -> None:
        """Wait on the monotonic clock (Event.wait uses it): wall-clock jumps neither stretch nor cut the nap."""
        self._event.wait(max(0.0, seconds))

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.set)
            signal.signal(signal.SIGINT, self.set)


# Waits between failed steps grow from the first backoff, doubling, up to this cap: an outage of a minute is
# retried often enough to recover within seconds of its end, without a log line or a connection attempt per ms.
MAX_ERROR_BACKOFF_SECONDS = 30.0


class Outage:
    """Consecutive failed steps of one process: a capped exponential backoff, logged once when an outage starts
    (with its traceback) and once when it ends, so a ten-minute database restart is two log lines, not 600.

    One per process: loops on several threads of a process (the materializer's batch threads) share it, so an
    outage is still one line, whichever thread meets it first.
    """

    def __init__(self, first_backoff_seconds: float = 1.0, max_backoff_seconds: float = MAX_ERROR_BACKOFF_SECONDS):
        self.first_backoff = first_backoff_seconds
        self.max_backoff = max_backoff_seconds
        self.failures = 0
        self._started = 0.0
        self._lock = threading.Lock()

    def failed(self, exc: BaseException) -> float:
        """Record a failed step; returns how long to wait before the next one."""
        with self._lock:
            self.failures += 1
            failures = self.failures
        if failures == 1:
            self._started = monotonic()
            logger.error(
                "step failed; retrying with backoff up to %.0fs (logged once per outage)",
                self.max_backoff,
                exc_info=exc,
                extra={"action": "step_error"},
            )
        else:
            logger.debug("step failed again (%d in a row): %r", failures, exc, extra={"action": "step_error"})
        # The exponent is bounded so a days-long outage cannot overflow the float before the cap applies.
        return min(self.max_backoff, self.first_backoff * 2 ** min(failures - 1, 32))

    def succeeded(self) -> None:
        if not self.failures:  # the common case, without the lock
            return
        with self._lock:
            failures, self.failures = self.failures, 0
        if failures:
            logger.warning(
                "recovered after %d failed steps (%.1fs)",
                failures,
                monotonic() - self._started,
                extra={"action": "step_recovered"},
            )


def run_loop(
    step: Callable[[], bool],
    stop: StopFlag,
    *,
    idle_seconds: float | Callable[[], float],
    once: bool = False,
    error_backoff_seconds: float = 1.0,
    on_error: Callable[[BaseException], None] | None = None,
    outage: Outage | None = None,
) -> None:
    """Call `step` while it reports work; when idle, sleep `idle_seconds` (or what the callable says).

    With `once`, return at the first idle step. An exception in a step does not end the process (a database or
    broker restart must not): `on_error` resets what the step depends on (e.g. closes a dead connection, so the
    next step opens a new one), then the step is retried after the Outage's backoff (`outage`: shared by the loops
    of one process).
    """
    outage = outage or Outage(error_backoff_seconds)
    while not stop.is_set:
        try:
            did_work = step()
        except Exception as exc:
            if once:
                raise
            backoff = outage.failed(exc)
            if on_error is not None:
                try:
                    on_error(exc)
                except Exception:
                    logger.debug("resetting after a failed step failed too", exc_info=True)
            stop.sleep(backoff)
            continue
        outage.succeeded()
        if did_work:
            continue
        if once:
            return
        nap = idle_seconds() if callable(idle_seconds) else idle_seconds
        IDLE_TRIM.before_nap(nap)
        stop.sleep(nap)


# An async nap wakes this often to see the stop flag (and to run its tick): SIGTERM ends even a long backoff at once.
NAP_SLICE_SECONDS = 0.25


async def nap_async(stop: StopFlag, seconds: float, *, tick: Callable[[], Awaitable[None]] | None = None) -> None:
    """The async face of StopFlag.sleep, on the monotonic clock: in slices, so a stop ends the nap within one, and
    `tick` runs at each slice (a loop backing off from an outage still writes its heartbeat)."""
    deadline = time.monotonic() + seconds
    while not stop.is_set and (left := deadline - time.monotonic()) > 0:
        if tick is not None:
            await tick()
        await asyncio.sleep(min(left, NAP_SLICE_SECONDS))


async def run_loop_async(
    step: Callable[[], Awaitable[bool]],
    stop: StopFlag,
    *,
    idle_seconds: Callable[[], Awaitable[float]],
    once: bool = False,
    on_error: Callable[[BaseException], None] | None = None,
    outage: Outage | None = None,
    while_out: Callable[[], Awaitable[None]] | None = None,
) -> bool:
    """The async face of run_loop, for a process whose steps await (the relay): the same steps, idling, backoff
    and outage log. `idle_seconds` is asked after an idle step, inside the same guard as the step; `while_out` runs
    during each backoff's nap. Returns True when `once` ended it at the first idle step, False when stopped."""
    outage = outage or Outage()
    while not stop.is_set:
        try:
            did_work = await step()
            idle = 0.0 if did_work or once else await idle_seconds()
        except Exception as exc:
            if once:
                raise
            backoff = outage.failed(exc)
            if on_error is not None:
                on_error(exc)
            await nap_async(stop, backoff, tick=while_out)
            continue
        outage.succeeded()
        if did_work:
            continue
        if once:
            return True
        IDLE_TRIM.before_nap(idle)
        await nap_async(stop, idle)
    return False


def freeze_startup_heap() -> None:
    """Exempt what start-up allocated (Django, the apps, their modules: ~a million objects) from garbage collection.

    A hot loop that allocates a few objects per fire triggers the cyclic collector's full passes, each of which
    walked that whole heap again: gc.freeze() moves it to a permanent generation. Measured on the materializer's
    planning: 13.8 -> 8.5 us of Python per schedule. Call once, when start-up is done.
    """
    gc.collect()
    gc.freeze()


def monotonic() -> float:
    return time.monotonic()


def default_process_name(role: str) -> str:
    """Unique across hosts, restarts and processes: leases, heartbeats and attempts name their owner by it."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


# A materializer batch or relay step handling this many fires (a burst's, a catch-up's) hands the memory it freed back
# to the system once it is done (return_free_memory); a steady one handles a second's worth or so and leaves it.
TRIM_AFTER_FIRES = 5_000


def return_free_memory() -> bool:
    """Hand the C allocator's free pages back to the system (glibc's malloc_trim); False where there is no glibc.

    A burst's batches allocate their rows, bodies and COPY buffers at once; Python frees them afterwards, but the
    allocator keeps the pages in its per-thread arenas, so the process's memory stayed at the burst's peak for the
    rest of its life (the steady bench: the materializer 94 -> 164 MB after its first 100,000-fire burst, for good).
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # 1 if it released pages, 0 if there were none to release
    except (OSError, AttributeError):
        return False
    return True


# Between bursts the free pages are handed back now and then too, at an idle step's nap long enough to hold the trim.
TRIM_EVERY_SECONDS = 60.0
TRIM_NAP_AT_LEAST = 0.1


class IdleTrim:
    """Hands free pages back at most every TRIM_EVERY_SECONDS, only before a nap of TRIM_NAP_AT_LEAST or more.

    Why not only after a burst: the steady work after it allocates into the free chunks the burst left all over the
    heap, and each page it writes is resident again until the next trim, so the process crept back to the burst's
    peak and stayed there (the relay: 91 -> 102 MB after the first burst of the steady bench, then flat, with its
    live Python memory unchanged; docs/DESIGN.md "Memory after a burst"). A trim holds the allocator for a few ms
    on a ~100 MB heap, so it waits for a nap, never in front of due work. One per process (`IDLE_TRIM`), shared by
    its loops' threads.
    """

    def __init__(self, every: float = TRIM_EVERY_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self._next = clock() + every
        self.trims = 0

    def before_nap(self, nap: float) -> bool:
        """Trim if one is due and the nap has room for it; True if it trimmed."""
        now = self.clock()
        if nap < TRIM_NAP_AT_LEAST or now < self._next:
            return False
        self._next = now + self.every
        self.trims += 1
        return return_free_memory()


IDLE_TRIM = IdleTrim()


async def idle_sleep(seconds: float) -> None:
    """asyncio.sleep for a loop with nothing else to do meanwhile (the relay waiting for its staged instant): the
    pause may first hand free memory back (IdleTrim)."""
    IDLE_TRIM.before_nap(seconds)
    await asyncio.sleep(seconds)
