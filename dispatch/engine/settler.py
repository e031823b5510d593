"""Settling: the relay's confirmation stamps copied onto their occurrences, on a connection and a task of its own.

The relay stamps one row per envelope at the hot instant (`published_at`). Settling then moves each occurrence
`scheduled → enqueued` with that stamp as `enqueued_at`, adds the enqueue lag histogram and deletes the envelope
(dispatch/sql/outbox.py SETTLE_PUBLISHED). It used to run as one batch of 20 envelopes per relay step, at most once a
second: about 12 envelopes a second, so under steady load the outbox grew without bound and the lag histogram,
written at settle, left out exactly the fires of a busy hour. Here it loops on its own connection while there is
work, in batches sized by how long the last statement took, and steps aside while the publisher releases a burst.
A stamp is settled once it is SETTLE_AFTER_SECONDS old, not at once: by then the worker has usually completed its
fires and copied the stamp itself, so settling only deletes the envelope and counts its lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import psycopg

from dispatch import counters
from dispatch.engine.loop import Outage, StopFlag, nap_async
from dispatch.sql import outbox as outbox_sql

logger = logging.getLogger(__name__)

# The settle step's lag histograms share one set of buckets (dispatch/counters.py).
LAG_BUCKETS = {"bounds": list(counters.SCHEDULE_LAG.buckets), "les": counters.SCHEDULE_LAG.bucket_labels()}
assert counters.SCHEDULE_LAG.buckets == counters.THROTTLED_LAG.buckets == counters.TENANT_SCHEDULE_LAG.buckets

# A settle statement holds the row locks of every occurrence it moves until it commits, and a worker claiming one of
# them waits for it: batches grow while a statement takes less than half of this and shrink when one takes more than
# twice (measured on two cores: 20 envelopes of 250 fires take ~0.1 s, 20 single-fire envelopes ~5 ms).
SETTLE_TARGET_SECONDS = 0.1
# The first batch (envelopes); SCHEDULER_SETTLE_BATCH bounds how far it may grow.
SETTLE_FIRST_BATCH = 20
# With nothing to settle, the settler waits for the publisher's next stamp, or this long (another relay's stamps).
SETTLE_IDLE_SECONDS = 1.0
# How old a stamp is before it is settled. Settled at once, an envelope's occurrences were still being claimed: the
# settle statement and the worker's claim waited for each other's row locks, and both wrote each row (the steady
# bench at 2,315 fires/s: the settler's connection busy ~100 % of the time, ~0.12 s a statement, mostly waiting, and no
# room to catch up after a burst). A moment later the worker has usually completed them and copied the stamp in its
# completion (dispatch/sql/claims.py COMPLETE_MANY), which the settle statement then leaves alone. The occurrence's
# enqueued_at is the stamp either way; only its `enqueued` state shows this much later when no worker was first.
# Three quarters of a second, not a whole one: steady fires start ~0.3 s after their instant (start lag p50), and the
# quarter second is headroom for the envelopes stamped while a burst's are settled (settle lag p99 target: 2 s).
SETTLE_AFTER_SECONDS = 0.75
# While the publisher releases a full batch (a burst), settling waits at most this long between statements: the
# burst's publishing comes first (a settle statement beside it cost a 500,000-fire burst 0.4 s of p99), yet a
# burst that lasts minutes is still settled as it goes.
SETTLE_MAX_DEFER_SECONDS = 1.0
# The classes of SETTLE_PUBLISHED (dispatch/sql/outbox.py SMALL_ENVELOPE): an envelope of a few fires is small (a
# steady second's), a bigger one is a burst's. Each class is settled by statements of its own, each with a batch sized
# by its own statements' duration, so a burst's envelopes never hold the steady ones back, and the steady ones never
# ration the burst's. Tied to a sixteenth of the small batch (at most 31 a statement), a 100,000-fire burst's ~5,000
# envelopes took 8 s to settle (steady bench: settle lag p99 5.7 s). Sharing a statement with them, the small batch was
# halved with every slow statement the burst's row writes made: ~10 steady envelopes a statement while ~1,000 a second
# were stamped, so the steady ones stamped during a burst waited up to 8-12 s (settle lag p99 7.3-8.4 s in 12-minute
# runs).
# The small class's turn ends after this long even if more is waiting: a burst's envelopes get a statement at least
# this often.
SMALL_TURN_SECONDS = 1.0
# With no big envelope found, the next look for one waits this long: the look reads every stamped envelope old enough.
BIG_LOOK_SECONDS = 1.0


def settle_params(limit: int, big_limit: int, min_age: float) -> dict[str, Any]:
    """The parameters of one settle statement of up to `limit` small and `big_limit` big envelopes stamped at least
    `min_age` seconds ago."""
    return {
        "limit": limit,
        "big_limit": big_limit,
        "min_age": min_age,
        **LAG_BUCKETS,
    }


def next_batch_size(current: int, *, settled: int, seconds: float, most: int) -> int:
    """The next settle batch (envelopes) after one that settled `settled` of `current` in `seconds`: doubled while
    full batches stay under the target duration, halved when one takes more than twice the target. (Doubling only
    under half the target, a batch halved by the first slow statements of a burst stayed at 62 envelopes in 0.09 s
    statements while ~1,000 a second were stamped.)"""
    if seconds > 2 * SETTLE_TARGET_SECONDS:
        return max(1, current // 2)
    if settled >= current and seconds < SETTLE_TARGET_SECONDS:
        return min(most, current * 2)
    return min(most, current)


class SettleStats(Protocol):
    settled_envelopes: int


class Settler:
    """Settles published envelopes for one relay: its own PostgreSQL connection, and in the relay process its own
    thread and event loop (`start_thread`); `relay --once` and tests run it on the caller's loop instead.

    The publisher tells it two things: `note_stamped()` (envelopes were just stamped: settle them once they are
    SETTLE_AFTER_SECONDS old rather than at the next idle tick) and `hold_back()` / `go_ahead()` (while a full batch
    is being released: wait up to SETTLE_MAX_DEFER_SECONDS between statements). Both are safe from another thread.
    """

    def __init__(self, name: str, conninfo: str, *, most: int, stats: SettleStats) -> None:
        self.name = name
        self.conninfo = conninfo
        self.most = most
        self.batch = min(SETTLE_FIRST_BATCH, most)
        # Big envelopes (a burst's) per statement, sized by their own statements from the first batch on. (From one,
        # the first burst's took seven turns to reach a useful batch, a turn a second while the steady class was busy.)
        self.big_batch = self.batch
        self._next_big_look = 0.0
        self.stats = stats
        self.more_waiting = False
        self.stamped = asyncio.Event()
        # Monotonic times of the publisher's stamps not yet old enough to settle, oldest first.
        self._stamps: deque[float] = deque()
        self.quiet = asyncio.Event()
        self.quiet.set()
        self._db: psycopg.AsyncConnection | None = None
        # Set by start_thread: the settler's own thread, its loop, and what stops it.
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._halt = StopFlag()

    async def connect(self) -> psycopg.AsyncConnection:
        if self._db is None or self._db.closed or self._db.broken:
            if self._db is not None:
                await self._db.close()
            # Autocommit: each settle statement is its own short transaction, and nothing stays open between them.
            # Named after its relay but not starting with its name: tools that count relays by application_name
            # (and the leases, which name the relay's own connection) see one connection per relay.
            self._db = await psycopg.AsyncConnection.connect(
                self.conninfo, application_name=f"settle {self.name}"[:63], autocommit=True
            )
        return self._db

    async def close(self) -> None:
        if self._thread is not None and self._thread.is_alive() and threading.current_thread() is not self._thread:
            return  # its connection belongs to its own loop: the thread closes it (stop_thread)
        if self._db is not None:
            await self._db.close()
            self._db = None

    # --- on a thread of its own ------------------------------------------------------------------------------

    def start_thread(self) -> None:
        """Settle on a thread with an event loop of its own until stop_thread (see the relay's `run_async`). On the
        publisher's loop a statement's result is read only when the loop comes back to it, behind every callback
        the publisher queued: while a burst was released (thousands of publishes in flight) the batch sizing read
        those waits as slow statements and the envelopes stamped meanwhile waited up to 13 s. On its own thread the
        result is read when it arrives: psycopg waits without the interpreter lock, and the publisher's thread
        hands the lock over within milliseconds. Started again by `ensure_running` if it ever died."""
        # Fresh events and loop, made before the thread starts: the publisher signals through this loop from the
        # first step on, and an event once waited on belongs to the loop that waited.
        self.stamped, self.quiet = asyncio.Event(), asyncio.Event()
        self.quiet.set()
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_own_loop, args=(loop,), name="settler", daemon=True)
        self._thread.start()

    def _run_own_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._own_loop())
        except BaseException:
            logger.exception("the settler's thread stopped on an error", extra={"action": "settle"})
        finally:
            loop.close()

    async def _own_loop(self) -> None:
        try:
            await self.run(self._halt)
        finally:
            with contextlib.suppress(psycopg.Error):
                await self.close()

    def ensure_running(self) -> None:
        """Start the thread again if it died (an error `run` did not absorb): the relay checks at every step, so its
        stamps never go unsettled while it keeps publishing and heartbeating."""
        if self._thread is not None and not self._thread.is_alive() and not self._halt.is_set:
            logger.error("the settler's thread had stopped; starting it again", extra={"action": "settle"})
            self._db = None  # its connection went with its loop
            self.start_thread()

    def stop_thread(self, timeout: float = 30.0) -> None:
        """Stop the settler's thread after its current statement; blocks until it ended or `timeout` passed."""
        if self._thread is None:
            return
        self._halt.set()
        self._signal(self.stamped.set)
        self._signal(self.quiet.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("the settler's thread did not stop within %.0f s", timeout, extra={"action": "settle"})

    def _signal(self, action: Callable[[], None]) -> None:
        """Run `action` (an event's set or clear) on the settler's loop: asyncio events are not thread-safe."""
        loop = self._loop
        if loop is None or self._thread is None or threading.current_thread() is self._thread:
            action()
            return
        with contextlib.suppress(RuntimeError):  # the loop already closed: nothing waits for the event any more
            loop.call_soon_threadsafe(action)

    # --- what the publisher tells it -------------------------------------------------------------------------

    def note_stamped(self) -> None:
        """The publisher stamped envelopes just now."""
        self._stamps.append(time.monotonic())
        self._signal(self.stamped.set)

    def hold_back(self) -> None:
        """The publisher is releasing a full batch (a burst): settle statements wait for it, within bounds."""
        if self.quiet.is_set():
            self._signal(self.quiet.clear)

    def go_ahead(self) -> None:
        if not self.quiet.is_set():
            self._signal(self.quiet.set)

    async def settle(self, *, min_age: float = SETTLE_AFTER_SECONDS) -> int:
        """Statements of small envelopes while they come back full (for up to SMALL_TURN_SECONDS), then one of big
        ones (when any may be waiting), each of its class's batch size and stamped at least `min_age` seconds ago;
        returns the envelopes settled. The steady envelopes come first: ~1,000 a second are stamped under the seed's
        load, and when the big class had every other statement during a burst they fell behind by seconds, while the
        burst's own envelopes, each full of fires, are settled in the time left.

        A connection found dead at its first use (PostgreSQL restarted while the settler waited) is opened again
        and the statement tried once more before it counts as a failure: the outage was the publisher's to report.
        """
        began = time.monotonic()
        small = 0
        while True:  # the small class first, to the end of its backlog or of its turn
            small_batch = self.batch
            settled = await self._retried(lambda: self._settle_once(big=False, min_age=min_age))
            small += settled
            if settled < small_batch or time.monotonic() - began >= SMALL_TURN_SECONDS:
                break
        big_batch = self.big_batch
        big = 0
        if time.monotonic() >= self._next_big_look:
            big = await self._retried(lambda: self._settle_once(big=True, min_age=min_age))
            if not big:
                self._next_big_look = time.monotonic() + BIG_LOOK_SECONDS
        # A full class means more may be waiting: the run loop goes on at once.
        self.more_waiting = small >= small_batch or big >= big_batch
        return small + big

    async def _retried(self, statement: Callable[[], Awaitable[int]]) -> int:
        try:
            return await statement()
        except psycopg.OperationalError:
            if self._db is None or not self._db.broken:
                raise
            await self.close()
            return await statement()

    async def _settle_once(self, *, big: bool, min_age: float) -> int:
        """One statement of one class; its batch is sized again by how long the statement took."""
        db = await self.connect()
        batch = self.big_batch if big else self.batch
        started = time.monotonic()
        # Never prepared: its generic plan (no batch size, no row counts) joins whole day partitions, 2 to 10 times
        # slower than the plan made for each batch; planning it costs a few milliseconds.
        params = settle_params(0, batch, min_age) if big else settle_params(batch, 0, min_age)
        cursor = await db.execute(outbox_sql.SETTLE_PUBLISHED, params, prepare=False)
        row = await cursor.fetchone()
        waited = time.monotonic() - started
        settle_lags = (row[1] or []) if row is not None else []
        for lag in settle_lags:
            counters.SETTLE_LAG.observe(max(0.0, float(lag)))
        settled = len(settle_lags)
        self.stats.settled_envelopes += settled
        # Sized by the time the statement held and waited for its row locks on the server, what the bound is for.
        # The time this side waited for the result also held whatever else the process ran meanwhile: sharing the
        # publisher's event loop while a burst was released, 62 envelopes "took" 0.24 s and 250 took 0.55 s, the
        # batch was halved to 31, and settling fell to ~600 envelopes a second while ~1,700 a second were stamped.
        held = float(row[3]) if row is not None and row[3] is not None else waited
        resized = next_batch_size(batch, settled=settled, seconds=held, most=self.most)
        if big:
            self.big_batch = resized
        else:
            self.batch = resized
        if settled:
            kind = "big" if big else "small"
            logger.debug(
                "settled %d %s envelopes in %.3f s (%.3f s on the server)",
                settled,
                kind,
                waited,
                held,
                extra={"action": "settle"},
            )
        return settled

    async def settle_all(self) -> int:
        """Settle until nothing is left (`relay --once`, before it exits)."""
        total = 0
        while True:
            self._next_big_look = 0.0  # every class, every time: nothing may be left
            settled = await self.settle(min_age=0.0)
            if not settled:
                break
            total += settled
        return total

    async def run(self, stop: StopFlag) -> None:
        """Settle while there is work, wait for a stamp when there is none; a failure (PostgreSQL down) backs off
        like any step, logged once per outage, and the connection is opened again. Its Outage is its own: the
        publisher's broker outages are none of its business, and its successes must not end theirs."""
        outage = Outage()
        while not stop.is_set:
            try:
                if not self.more_waiting and not await self._until_stamps_age():
                    continue  # a new stamp: wait for it to age
                if not self.quiet.is_set():
                    await _wait(self.quiet, SETTLE_MAX_DEFER_SECONDS)
                began = time.monotonic()
                await self.settle()
                outage.succeeded()
                if not self.more_waiting:
                    # Every stamp old enough when the statement began is settled (or another settler's).
                    while self._stamps and self._stamps[0] <= began - SETTLE_AFTER_SECONDS:
                        self._stamps.popleft()
                await asyncio.sleep(0)  # let the publisher's task run in between
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self.close()
                await nap_async(stop, outage.failed(exc))

    async def _until_stamps_age(self) -> bool:
        """Wait until the oldest stamp not settled yet is SETTLE_AFTER_SECONDS old (True). With none, wait for a new
        stamp (False: then for it to age) or SETTLE_IDLE_SECONDS (True: other relays' stamps are settled too)."""
        if self._stamps:
            await asyncio.sleep(max(0.0, self._stamps[0] + SETTLE_AFTER_SECONDS - time.monotonic()))
            return True
        self.stamped.clear()
        await _wait(self.stamped, SETTLE_IDLE_SECONDS)
        return not self.stamped.is_set()


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Until `event` is set or `seconds` passed, whichever comes first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
