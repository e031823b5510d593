"""The materializer: turns due schedule cursors into occurrences and outbox envelopes, shard by shard.

Each process leases a fair share of the logical shards and, per batch, in ONE transaction (docs/ARCHITECTURE.md
rule 3):
1. confirms its leases (owner + generation) and holds them FOR SHARE until commit (fencing);
2. locks the due schedules of those shards (next_run_at <= now + horizon), SKIP LOCKED;
3. plans fires with the misfire policy and lanes (dispatch/planning.py), at most MAX_FIRES_PER_BATCH in all;
4. inserts the occurrences (conflicts ignored) and outbox envelopes for the new, enqueueable ones;
5. advances each cursor only where version and old cursor still match; a one-off whose occurrence ended
   becomes completed in the maintenance pass.
Day partitions, retention and vacuum are the upkeep's (dispatch/upkeep.py), on a thread of its own.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from core.clock import db_now
from core.exclusions import Exclusions
from dispatch import counters
from dispatch.calendars import Named, batch_exclusions
from dispatch.engine import loop
from dispatch.engine.faults import crash_point
from dispatch.engine.leases import reap_expired_leases
from dispatch.engine.loop import Outage, StopFlag, default_process_name, freeze_startup_heap, monotonic, run_loop
from dispatch.errors import ShardCountMismatch
from dispatch.occurrence_rows import write_envelopes, write_occurrences
from dispatch.planning import MISSED, DueSchedule, Plan, Walk, walk_fires, walk_key
from dispatch.quotas import pace_planned
from dispatch.sql import PreparedCursor
from dispatch.sql import leases as lease_sql
from dispatch.sql import materialize as materialize_sql
from dispatch.upkeep import LARGE_LANE, SMALL_LANE, Upkeep

logger = logging.getLogger(__name__)

ROLE = "materializer"

# Most fires one batch plans across its schedules. After a long outage every due schedule is far behind, and
# batch_size x MAX_FIRES_PER_SCHEDULE fires (a million) in one transaction took 29 s of CPU and 223 MiB. The
# schedules past the bound keep their cursors (their row locks end at commit) and the next batches take them. A
# constant, not a setting: it bounds memory and transaction length, not a policy anyone tunes.
MAX_FIRES_PER_BATCH = 20_000

# The scan's row (SCAN_DUE_SCHEDULES): DueSchedule's fields, then the cursor's shard, its row address and the schedule
# id's text.
SHARD_COLUMN = -3
ROW_ADDRESS_COLUMN = -2
ID_TEXT_COLUMN = -1


_CALENDARS_COLUMN = DueSchedule._fields.index("exclusions")
_TENANT_COLUMN = DueSchedule._fields.index("tenant_id")


def _calendars_named(rows: list[tuple]) -> set[Named]:
    """(tenant_id, calendar names) of the scan's rows that name calendars."""
    return {(row[_TENANT_COLUMN], tuple(row[_CALENDARS_COLUMN])) for row in rows if row[_CALENDARS_COLUMN]}


# A shard's share of a batch is at least this many cursors: with a share of one or two, every row the scan returned
# would look like a shard cut short (batch_was_full), and a short batch would scan again at once instead of napping.
MIN_SHARD_SHARE = 16


def shard_share(batch_size: int, shards: int) -> int:
    """Due cursors a batch takes from each leased shard at most: an equal share of the batch (dispatch/sql/
    materialize.py SCAN_DUE_SCHEDULES)."""
    return max(MIN_SHARD_SHARE, math.ceil(batch_size / max(1, shards)))


def batch_was_full(rows: list[tuple], *, limit: int, per_shard: int) -> bool:
    """More may be due than the scan returned: it stopped at the batch's limit, or at some shard's share."""
    if len(rows) >= limit:
        return True
    per = Counter(row[SHARD_COLUMN] for row in rows)
    return any(count >= per_shard for count in per.values())


@dataclass(frozen=True)
class BatchWritten:
    processed: int  # schedules planned and written
    more_due: bool  # the batch was full (or deferred some): due schedules may be waiting


class Materializer:
    def __init__(
        self,
        name: str | None = None,
        *,
        batch_size: int | None = None,
        horizon_seconds: float | None = None,
        lease_seconds: float | None = None,
        shards: int | None = None,
        threads: int | None = None,
        clock: Callable[[], datetime] | None = None,
        duties: Sequence[Callable[[], object]] = (),
    ) -> None:
        self.name = name or default_process_name(ROLE)
        # Periodic work of the layers above, run with the maintenance pass (the materialize command passes the
        # control plane's resume of pauses whose resume_at has come): the engine calls it, never imports it.
        self.duties = tuple(duties)
        self.batch_size = batch_size or settings.SCHEDULER_MATERIALIZE_BATCH
        self.horizon = timedelta(seconds=horizon_seconds or settings.SCHEDULER_HORIZON_SECONDS)
        self.lease_seconds = lease_seconds or settings.SCHEDULER_LEASE_SECONDS
        self.shards = shards or settings.SCHEDULER_SHARDS
        self.threads = threads or settings.SCHEDULER_MATERIALIZE_THREADS
        self.clock = clock or db_now
        self.leases: dict[int, int] = {}  # shard -> generation granted to us
        self._next_maintenance = 0.0
        self._rotation = 0
        # Set while batches come back full (more is due than one batch holds): the helper threads write batches
        # only then (see _helper_step).
        self._draining = False
        # Set by a batch of many fires (a burst, a catch-up): once the drain ends, free memory goes back.
        self._trim_due = False
        self.stop = StopFlag()
        self.upkeep = Upkeep(SMALL_LANE)
        self.large_upkeep = Upkeep(LARGE_LANE)
        self.outage = Outage()  # one for the main loop and the batch threads: an outage is logged once

    # --- leases ------------------------------------------------------------------------------------------------

    def verify_shard_count(self) -> None:
        """Refuse to start with fewer shards than the data uses (docs/ARCHITECTURE.md rule 11): a lowered
        SCHEDULER_SHARDS would leave every schedule on a shard >= the new count without a lease, never fired."""
        with connection.cursor() as cursor:
            cursor.execute(lease_sql.SHARDS_IN_USE)
            in_use = cursor.fetchone()[0]
        if in_use > self.shards:
            raise ShardCountMismatch(
                f"The database already uses {in_use} shards, but this materializer is configured with "
                f"SCHEDULER_SHARDS={self.shards}: the schedules on shards {self.shards}..{in_use - 1} would never "
                f"fire. Set SCHEDULER_SHARDS={in_use} (the shard count can grow, never shrink)."
            )

    def maintain_leases(self) -> None:
        """Heartbeat, renew what we hold, then converge on a fair share: ceil(shards / live materializers)."""
        with connection.cursor() as cursor:
            cursor.execute(lease_sql.ENSURE_SHARD_ROWS, {"shards": self.shards})
            counters.write_heartbeat(cursor, self.name, ROLE)
            cursor.execute(
                lease_sql.RENEW_SHARD_LEASES,
                {
                    "owner": self.name,
                    "ttl": self.lease_seconds,
                    "shards": list(self.leases),
                    "generations": list(self.leases.values()),
                },
            )
            renewed = dict(cursor.fetchall())
            lost = set(self.leases) - set(renewed)
            if lost:
                logger.warning("lost shard leases %s", sorted(lost), extra={"action": "lease_lost"})
            self.leases = renewed
            cursor.execute(lease_sql.LIVE_PROCESSES, {"role": ROLE, "ttl": self.lease_seconds * 2})
            live = max(1, cursor.fetchone()[0])
            fair_share = math.ceil(self.shards / live)
            if len(self.leases) > fair_share:
                extra = sorted(self.leases)[fair_share:]
                cursor.execute(lease_sql.RELEASE_SHARD_LEASES, {"owner": self.name, "shards": extra})
                for shard in extra:
                    self.leases.pop(shard, None)
                logger.info("released %d shards to peers", len(extra), extra={"action": "lease_release"})
            elif len(self.leases) < fair_share:
                cursor.execute(
                    lease_sql.CLAIM_SHARD_LEASES,
                    {"owner": self.name, "ttl": self.lease_seconds, "limit": fair_share - len(self.leases)},
                )
                claimed = dict(cursor.fetchall())
                if claimed:
                    logger.info("claimed %d shards", len(claimed), extra={"action": "lease_claim"})
                self.leases.update(claimed)
        self._next_maintenance = monotonic() + self.lease_seconds / 3

    def _after_failed_step(self, exc: BaseException) -> None:
        """A failed step may have left Django's connection dead (PostgreSQL restart, failover, a terminated
        backend): close it so the next step connects afresh. Leases may have expired meanwhile; the next
        maintenance renews what is still ours and reports what was lost."""
        connection.close()
        self._next_maintenance = 0.0

    def complete_fired_one_offs(self, limit: int = 1000) -> int:
        """Mark completed the one-offs whose occurrence has ended (docs/ARCHITECTURE.md, "Data model": a one-off
        is completed once it fired, not once it was materialized a horizon ahead)."""
        with connection.cursor() as cursor:
            cursor.execute(materialize_sql.COMPLETE_FIRED_ONE_OFFS, {"limit": limit})
            return cursor.rowcount

    def release_all(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(lease_sql.RELEASE_SHARD_LEASES, {"owner": self.name, "shards": list(self.leases)})
            cursor.execute(lease_sql.FORGET_PROCESS, {"name": self.name})
        self.leases = {}

    # --- batches -----------------------------------------------------------------------------------------------

    def step(self, now: datetime | None = None) -> bool:
        """One unit of work: maintenance when due, then one batch. True if the batch found due schedules."""
        self._maintain_when_due()
        return self.materialize_batch(now or self.clock()) > 0

    def _process_step(self) -> bool:
        """The main thread's step in the process loop: maintenance when due, then one batch (see _drain_step)."""
        self._maintain_when_due()
        return self._drain_step()

    def _maintain_when_due(self) -> None:
        if monotonic() >= self._next_maintenance:
            self.maintain_leases()
            # Leases of dead workers (SIGKILL, OOM) come back for another attempt. PostgreSQL's clock, not a
            # driven `now`: a test's future instant would reap leases that are still alive.
            reap_expired_leases()
            self.complete_fired_one_offs()
            for duty in self.duties:
                self._run_duty(duty)

    @staticmethod
    def _run_duty(duty: Callable[[], object]) -> None:
        """One duty of the maintenance pass; its failure is logged and retried next pass, never the loop's end."""
        try:
            duty()
        except DatabaseError:
            raise  # the loop's outage handling owns lost connections
        except Exception:
            logger.exception("maintenance duty %s failed", getattr(duty, "__name__", duty), extra={"action": "duty"})

    def materialize_batch(self, now: datetime) -> int:
        """Plan and write one batch; returns the number of schedules processed."""
        return self._write_batch(now).processed

    def _drain_step(self) -> bool:
        """One batch of the main thread's loop: True (go on at once) only while a batch may have left due schedules
        behind.

        A batch short of its limit read every cursor due within the horizon, so the loop naps as if idle
        (SCHEDULER_MATERIALIZE_IDLE_SECONDS) instead of scanning again at once: each scan visits every leased shard's
        index range (256 probes however few are due), and under steady load back-to-back scans of three threads found
        a few hundred schedules each, ~3 scans a second for what one scan a second finds. The horizon is far longer
        than the nap, so a fire is still written long before it is due.
        """
        more_due = self._write_batch(self.clock()).more_due
        self._draining = more_due
        if not more_due and self._trim_due:
            self._trim_due = False
            self._give_back_memory()
        return more_due

    def _helper_step(self) -> bool:
        """One batch of a helper thread's loop: only while the main thread found more due than one batch holds (a
        burst, a catch-up); otherwise the helper naps and leaves the steady scan to the main thread."""
        if not self._draining:
            return False
        more_due = self._write_batch(self.clock()).more_due
        if not more_due:
            self._draining = False
            self._give_back_memory()
        return more_due

    @staticmethod
    def _give_back_memory() -> None:
        """A burst is written: this thread's share of its memory goes back (docs/DESIGN.md "Memory after a burst").
        libpq keeps a connection's buffers at the largest result and COPY it carried (a 20,000-schedule batch's), so
        the thread's connection is closed first (its next batch opens a fresh one), then the allocator's free pages
        are handed back."""
        connection.close()
        loop.return_free_memory()

    def _write_batch(self, now: datetime) -> BatchWritten:
        leases = dict(self.leases)  # one consistent view: the lease upkeep may replace them meanwhile
        if not leases:
            return BatchWritten(0, more_due=False)
        with transaction.atomic(), PreparedCursor() as cursor:
            # Rotate the starting shard every batch so a burst is drained evenly across shards.
            shards = sorted(leases)
            self._rotation = (self._rotation + 1) % len(shards)
            shards = shards[self._rotation :] + shards[: self._rotation]
            # A shard's share of the batch: an equal share of every leased shard, so a burst's batch is a run of whole
            # tenants (dispatch/sql/materialize.py SCAN_DUE_SCHEDULES), and no shard's range fills the batch alone
            # (15 -> 6 us a schedule at 100,000, with the ordered scan above).
            per_shard = shard_share(self.batch_size, len(shards))
            cursor.execute(materialize_sql.INDEX_READS_ONLY)
            cursor.execute(
                materialize_sql.SCAN_DUE_SCHEDULES,
                {
                    "shards": shards,
                    "horizon_end": now + self.horizon,
                    "limit": self.batch_size,
                    "per_shard": per_shard,
                },
            )
            rows = cursor.fetchall()
            if not rows:
                return BatchWritten(0, more_due=False)
            full = batch_was_full(rows, limit=self.batch_size, per_shard=per_shard)
            rows = self._confirm_leases(cursor, rows, leases)
            if not rows:
                return BatchWritten(0, more_due=full)
            plans = self._plan(rows, now, batch_exclusions(cursor, _calendars_named(rows)))
            # Kept late fires (after an outage) are released on their tenant's one catch-up budget.
            pace_planned(cursor, [(p.schedule, p.occurrences) for p in plans if p.catch_up], now=now)
            crash_point("materializer.before_insert")
            new_ids = write_occurrences(cursor, plans, now)
            envelopes = write_envelopes(cursor, plans, new_ids)
            self._advance_cursors(cursor, plans, [row[ROW_ADDRESS_COLUMN] for row in rows[: len(plans)]])
        crash_point("materializer.after_commit")
        planned = sum(len(p.occurrences) for p in plans)
        self._trim_due = self._trim_due or planned >= loop.TRIM_AFTER_FIRES
        written = planned if new_ids is None else len(new_ids)
        new = (o for p in plans for o in p.occurrences if new_ids is None or o.occurrence_id in new_ids)
        missed = sum(1 for o in new if o.state == MISSED)
        counters.MATERIALIZED.inc(written)
        counters.MATERIALIZER_CONFLICTS.inc(planned - written)
        counters.MISSED.labels("materialize").inc(missed)
        logger.info(
            "materialized %d schedules: %d new occurrences (%d missed) in %d envelopes",
            len(plans),
            written,
            missed,
            envelopes,
            extra={"action": "materialize_batch"},
        )
        if len(plans) < len(rows):
            logger.info(
                "deferred %d due schedules to the next batch: %d fires planned, bound %d",
                len(rows) - len(plans),
                planned,
                MAX_FIRES_PER_BATCH,
                extra={"action": "materialize_deferred"},
            )
        return BatchWritten(len(plans), more_due=full or len(plans) < len(rows))

    def _confirm_leases(self, cursor: PreparedCursor, rows: list[tuple], leases: dict[int, int]) -> list[tuple]:
        """Fencing (rule 3): the leases of the shards this batch read must still be ours, with the generation we were
        granted; the rows of any other shard are left as they are (their row locks end at commit).

        Confirmed after the scan, for the shards the batch touched (a handful): FOR SHARE holds those lease rows to
        the commit, so a takeover waits for this batch, and one that came before the confirmation leaves its shard
        out. Confirming every leased shard before the scan locked 256 lease rows per batch, shared by concurrent
        batches (a MultiXact per row and batch).
        """
        touched = sorted({row[SHARD_COLUMN] for row in rows})
        cursor.execute(
            lease_sql.CONFIRM_SHARD_LEASES,
            {"owner": self.name, "shards": touched, "generations": [leases[shard] for shard in touched]},
        )
        confirmed = {row[0] for row in cursor.fetchall()}
        if len(confirmed) == len(touched):
            return rows
        logger.warning(
            "shard leases %s were lost; their schedules are left to the new owner",
            sorted(set(touched) - confirmed),
            extra={"action": "lease_lost"},
        )
        return [row for row in rows if row[SHARD_COLUMN] in confirmed]

    def _plan(self, rows: list[tuple], now: datetime, exclusions: dict[Named, Exclusions]) -> list[Plan]:
        """Plan due schedules in scan order while a worst-case chunk of the next one still fits the bound, so a
        batch never plans more than MAX_FIRES_PER_BATCH. The first is always planned: a batch makes progress.
        `exclusions`: what the calendars named by the rows exclude (batch_exclusions)."""
        plans: list[Plan] = []
        planned = 0
        # A burst's schedules share a few rhythms and cursors: each distinct walk is made once per batch.
        walks: dict[tuple, Walk] = {}
        for row in rows:
            schedule = DueSchedule._make(row[:SHARD_COLUMN])
            if schedule.exclusions is not None:
                named = (schedule.tenant_id, tuple(row[_CALENDARS_COLUMN]))
                schedule = schedule._replace(exclusions=exclusions.get(named))
            key = walk_key(schedule)
            walk = walks.get(key)
            if walk is None:
                walk = walks[key] = walk_fires(schedule, now=now, horizon=self.horizon)
            if plans and planned + walk.cap > MAX_FIRES_PER_BATCH:
                break
            plan = walk.plan_for(schedule, row[ID_TEXT_COLUMN])
            plans.append(plan)
            planned += len(plan.occurrences)
        return plans

    @staticmethod
    def _advance_cursors(cursor: PreparedCursor, plans: list[Plan], rows: list[str]) -> None:
        """Move the cursors of `plans`, found at `rows` (their row addresses from the scan, in the same order)."""
        cursor.execute(
            materialize_sql.ADVANCE_CURSORS,
            {
                "rows": rows,
                "versions": [p.schedule.version for p in plans],
                "old_cursors": [p.schedule.next_run_at for p in plans],
                # A one-off's cursor becomes NULL: the maintenance pass completes the schedule once its occurrence
                # has ended (complete_fired_one_offs), at once if the fire was recorded missed.
                "new_cursors": [p.new_cursor for p in plans],
                # Under max_runs, what is left once this batch's fires are written (NULL: no limit).
                "remaining_runs": [p.remaining_runs for p in plans],
            },
        )
        if cursor.rowcount != len(plans):
            # Cannot happen while the scan's row locks hold; if it does, the transaction's occurrences are still
            # correct (deterministic ids) and the stale cursor is re-planned next batch to the same rows.
            logger.error("advanced %d of %d cursors", cursor.rowcount, len(plans), extra={"action": "cursor_mismatch"})

    # --- process -----------------------------------------------------------------------------------------------

    def write_batches(self) -> None:
        """The loop of a batch thread: batches until stopped, on a connection of its own (Django's are per thread).

        The main thread's step() keeps the leases and the heartbeat, and writes batches too; the other threads only
        write batches, so PostgreSQL works on one while Python plans the next.
        """
        try:
            run_loop(
                self._helper_step,
                self.stop,
                idle_seconds=settings.SCHEDULER_MATERIALIZE_IDLE_SECONDS,
                on_error=lambda exc: connection.close(),
                outage=self.outage,
            )
        finally:
            connection.close()

    def keep_up(self, upkeep: Upkeep) -> None:
        """An upkeep thread: day partitions, retention and vacuum when due, or the large tables' vacuum
        (dispatch/upkeep.py), on a connection of its own in autocommit. Apart from the main thread, so a long VACUUM
        never delays the lease renewals, and from the batches, so no upkeep lock is ever taken inside a batch
        transaction."""
        try:
            run_loop(
                lambda: upkeep.run_due(self.clock()),
                self.stop,
                idle_seconds=upkeep.seconds_until_due,
                on_error=lambda exc: connection.close(),
                outage=self.outage,
            )
        finally:
            connection.close()

    def run(self, *, once: bool = False) -> None:
        self.stop.install()
        self.verify_shard_count()
        logger.info("materializer %s starting", self.name, extra={"action": "start"})
        counters.start_flushing(settings.SCHEDULER_HEARTBEAT_SECONDS)
        freeze_startup_heap()
        helpers = [
            threading.Thread(target=self.write_batches, name=f"{self.name}-batches-{n + 1}", daemon=True)
            for n in range(0 if once else self.threads - 1)
        ]
        upkeep = [
            threading.Thread(target=self.keep_up, args=(lane,), name=f"{self.name}-upkeep-{n + 1}", daemon=True)
            for n, lane in enumerate([] if once else [self.upkeep, self.large_upkeep])
        ]
        if helpers:
            # A thread whose PostgreSQL round trip has returned waits for the GIL while another plans: up to the
            # switch interval, 5 ms by default, with its backend idle and its row locks held. 0.1 ms measured
            # 23,800 -> 27,700 schedules/s with two threads (docs/BENCHMARKS.md, "Materialization").
            sys.setswitchinterval(0.0001)
        try:
            for helper in helpers + upkeep:
                helper.start()
            if once:
                self.upkeep.run_due(self.clock())
                self.large_upkeep.run_due(self.clock())
            run_loop(
                self._process_step,
                self.stop,
                idle_seconds=settings.SCHEDULER_MATERIALIZE_IDLE_SECONDS,
                once=once,
                on_error=self._after_failed_step,
                outage=self.outage,
            )
        finally:
            self.stop.set()  # a failure of the main loop stops the other threads too
            self.upkeep.interrupt()
            self.large_upkeep.interrupt()
            for helper in helpers + upkeep:
                helper.join(timeout=30)
            try:
                self.release_all()
            except DatabaseError:
                # The database is gone as we stop: the leases expire by themselves and peers take them over.
                logger.warning("could not release leases on exit", extra={"action": "stop"})
            counters.stop_flushing()
            logger.info("materializer %s stopped; leases released", self.name, extra={"action": "stop"})
