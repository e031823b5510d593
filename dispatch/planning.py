"""Pure rules of materialization: which fires of a due schedule become occurrences now, in which state and at
what instant, and where its cursor moves. No database here; `now` is always passed in (PostgreSQL's clock)."""

from __future__ import annotations

import functools
import operator
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from core.choices import Kind, Lane, MisfirePolicy
from core.exclusions import ExclusionsLike
from core.timerules import TimeRule, parse_timezone
from dispatch.identity import name_prefix, name_suffix, occurrence_id_of
from dispatch.models import OccurrenceState


def flexible_offset(occurrence_id: uuid.UUID, window_seconds: int) -> timedelta:
    """Deterministic jitter inside the flexible window: the same occurrence gets the same instant after every
    failover or replay, while correlated fires spread out. Millisecond resolution."""
    window_ms = max(1, window_seconds * 1000)
    return timedelta(milliseconds=occurrence_id.int % window_ms)


# Upper bound of fires planned for one schedule in one batch: a schedule far behind (after an outage) is
# walked forward in chunks across batches instead of stalling one transaction. A catch-up that keeps more late
# fires than this gets a larger chunk (see fire_cap).
MAX_FIRES_PER_SCHEDULE = 500


class DueSchedule(NamedTuple):
    """The columns of a due schedule row that planning needs. A named tuple: the materializer makes one per due
    schedule straight from the scan's row, in C (a slotted dataclass's __init__ was a tenth of its planning time)."""

    id: uuid.UUID
    tenant_id: int
    kind: str
    cron: str | None
    run_at: datetime | None
    timezone: str
    version: int
    next_run_at: datetime
    lane: str
    flexible_window_seconds: int
    priority: int
    misfire_policy: str
    max_lateness_seconds: int
    catchup_limit: int
    catchup_per_minute: int
    # Kind "interval" only; last, with defaults, so that the other kinds' callers need not name them.
    every_seconds: int | None = None
    anchor_at: datetime | None = None
    # Kind "cron" only: its DST policy (None is the default, skip and first).
    dst_gap: str | None = None
    dst_repeat: str | None = None
    # Every kind: the window its fires lie in (None: unbounded).
    start_at: datetime | None = None
    end_at: datetime | None = None
    # Fires left to write under max_runs (None: no limit). Not part of the walk: each schedule's plan is cut to it.
    remaining_runs: int | None = None
    # Every kind: what its calendars exclude, as they are now (None: none). The scan's row holds the calendars'
    # names here; the materializer puts their Exclusions in their place (dispatch/calendars.py).
    exclusions: ExclusionsLike | None = None

    @property
    def rule(self) -> TimeRule:
        return self._rule_with(self.exclusions)

    @property
    def rhythm(self) -> TimeRule:
        """The rule without the calendars: what the cursor follows (walk_fires)."""
        return self._rule_with(None)

    def _rule_with(self, exclusions: ExclusionsLike | None) -> TimeRule:
        return _time_rule(
            self.kind,
            self.timezone,
            self.cron,
            self.run_at,
            self.every_seconds,
            self.anchor_at,
            self.dst_gap,
            self.dst_repeat,
            self.start_at,
            self.end_at,
            exclusions,
        )


def due_schedule_of(columns: Mapping[str, Any], **given: Any) -> DueSchedule:
    """A DueSchedule from a schedule's columns by name (a model row's `vars()`, a definition), `given` taking
    precedence: the one way the paths outside the materializer's scan (owed fires, the console's preview) build one.
    Every field must be named by one of the two, so a column missing from a partly loaded row fails here instead of
    planning with a default."""
    return DueSchedule(**{name: given[name] if name in given else columns[name] for name in DueSchedule._fields})


def late_one_off_fires(definition: Mapping[str, Any], rule: TimeRule, *, now: datetime) -> bool:
    """Whether a one-off whose run_at has passed would fire now if created, or be recorded missed: its misfire
    policy decides, by the materializer's own rule (a preview and a create must agree)."""
    run_at = rule.run_at
    due = due_schedule_of(
        definition,
        id=uuid.uuid4(),
        tenant_id=0,
        kind=rule.kind,
        cron=None,
        run_at=run_at,
        timezone=rule.timezone,
        version=1,
        next_run_at=run_at,
        catchup_per_minute=60,
        every_seconds=None,
        anchor_at=None,
        dst_gap=None,
        dst_repeat=None,
        start_at=rule.start_at,
        end_at=rule.end_at,
        remaining_runs=None,
        exclusions=rule.exclusions,
    )
    return bool(plan_schedule(due, now=now, horizon=timedelta(0)).to_enqueue)


@functools.lru_cache(maxsize=4096)
def _time_rule(
    kind: str,
    timezone: str,
    cron: str | None,
    run_at: datetime | None,
    every_seconds: int | None,
    anchor_at: datetime | None,
    dst_gap: str | None,
    dst_repeat: str | None,
    start_at: datetime | None,
    end_at: datetime | None,
    exclusions: ExclusionsLike | None,
) -> TimeRule:
    """One TimeRule per distinct rule: a burst's schedules share a few rhythms."""
    return TimeRule(
        kind=kind,
        timezone=timezone,
        cron=cron,
        run_at=run_at,
        every_seconds=every_seconds,
        anchor_at=anchor_at,
        dst_gap=dst_gap,
        dst_repeat=dst_repeat,
        start_at=start_at,
        end_at=end_at,
        exclusions=exclusions,
    )


# Value objects, but not frozen: the materializer makes one of each per fire, and a frozen dataclass's __init__
# (object.__setattr__ per field) cost twice as much. Slots keep them small.
@dataclass(slots=True)
class PlannedOccurrence:
    occurrence_id: uuid.UUID
    scheduled_for: datetime
    available_at: datetime
    state: str  # scheduled (goes to the queue) or missed (recorded, never enqueued)
    reason: str = ""  # why a fire is missed, in words an operator can act on (Occurrence.state_reason)
    # A late fire the misfire policy keeps: its available_at is `now` here, and the writer paces it on the tenant's
    # catch-up budget (dispatch/quotas.py pace_catch_up) before it is stored.
    catch_up: bool = False


@dataclass(slots=True)
class Plan:
    schedule: DueSchedule
    occurrences: list[PlannedOccurrence] = field(default_factory=list)
    new_cursor: datetime | None = None
    # Some of its fires are kept late fires, to be paced on the tenant's catch-up budget before they are written.
    catch_up: bool = False
    # Fires left under max_runs once this plan's are written (None: no limit).
    remaining_runs: int | None = None

    @property
    def completed(self) -> bool:
        """No fire left after this plan's: a one-off whose fire it holds."""
        return self.new_cursor is None

    @property
    def to_enqueue(self) -> list[PlannedOccurrence]:
        return [o for o in self.occurrences if o.state == SCHEDULED]


# The states planned fires carry, as plain text: the materializer compares and writes one per fire, and the enum's
# attribute lookups (Python-level descriptors in 3.11) showed up in its profile. Equal to the enum members.
SCHEDULED = OccurrenceState.SCHEDULED.value
MISSED = OccurrenceState.MISSED.value


def kept_late_fires(schedule: DueSchedule) -> int:
    """How many of the latest late fires the misfire policy emits: none (skip), one (fire_once) or K (catch_up)."""
    if schedule.misfire_policy == MisfirePolicy.FIRE_ONCE:
        return 1
    if schedule.misfire_policy == MisfirePolicy.CATCH_UP:
        return schedule.catchup_limit
    return 0


def fire_cap(schedule: DueSchedule) -> int:
    """The most fires one batch plans for `schedule`. A chunk holds the K kept late fires and one more, so the
    batch that reaches the lateness limit emits (and paces) all K together: split over two batches, each would pace
    its share from its own "now" and the tenant's catch-up rate would be exceeded."""
    return max(MAX_FIRES_PER_SCHEDULE, kept_late_fires(schedule) + 1)


@dataclass(frozen=True, slots=True)
class WalkedFire:
    """One fire of a walk and what the misfire policy made of it, before it has an occurrence id."""

    at: datetime
    state: str  # scheduled or missed
    reason: str = ""
    catch_up: bool = False


@dataclass(frozen=True, slots=True)
class Walk:
    """The fires of a rule from a cursor up to the horizon, judged by a misfire policy, at one `now`.

    It depends on the rule, the cursor and the policy only, not on the schedule's id: at the top of the hour most
    due schedules share a handful of rhythms and cursors, and the materializer walks each of those once per batch
    (walk_key), then only names each schedule's fires (Walk.plan_for).
    """

    fires: tuple[WalkedFire, ...]
    new_cursor: datetime | None
    now: datetime
    # fire_cap of the schedules that share this walk (it depends only on fields of the walk key).
    cap: int = MAX_FIRES_PER_SCHEDULE
    catch_up: bool = False  # one of its fires is a kept late fire (Plan.catch_up)
    # Per schedule version, the second half of each fire's id name ("/{version}/{instant}"): made once per walk.
    _suffixes: dict[int, tuple[bytes, ...]] = field(default_factory=dict, compare=False, repr=False)

    def plan_for(self, schedule: DueSchedule, schedule_text: str | None = None) -> Plan:
        """`schedule`'s plan: its occurrence id for each fire, and the release instant on its lane. `schedule_text`
        is its id's canonical text when the caller has it already (PostgreSQL sends it with the due row)."""
        plan = Plan(schedule=schedule, new_cursor=self.new_cursor, catch_up=self.catch_up)
        suffixes = self._suffixes.get(schedule.version)
        if suffixes is None:
            suffixes = self._suffixes[schedule.version] = tuple(name_suffix(schedule.version, f.at) for f in self.fires)
        fires = self.fires
        remaining = schedule.remaining_runs
        if remaining is not None:
            # Only the first max_runs fires exist: the last one ends the rhythm (the cursor stops, NULL).
            if len(fires) >= remaining:
                fires, suffixes, plan.new_cursor = fires[: max(0, remaining)], suffixes[: max(0, remaining)], None
            plan.remaining_runs = max(0, remaining - len(fires))
        prefix = name_prefix(schedule_text or str(schedule.id))
        flexible = schedule.lane == Lane.FLEXIBLE
        for fire, suffix in zip(fires, suffixes, strict=True):
            occurrence_id = occurrence_id_of(prefix, suffix)
            if fire.catch_up:
                available_at = self.now
            elif flexible and fire.state == SCHEDULED:
                available_at = fire.at + flexible_offset(occurrence_id, schedule.flexible_window_seconds)
            else:
                available_at = fire.at
            plan.occurrences.append(
                PlannedOccurrence(occurrence_id, fire.at, available_at, fire.state, fire.reason, fire.catch_up)
            )
        return plan


# What a Walk depends on: due schedules with the same key (at one `now` and horizon) walk the same fires. An
# itemgetter, because the materializer takes the key of every due schedule.
WALK_KEY_FIELDS = (
    "kind",
    "cron",
    "run_at",
    "every_seconds",
    "anchor_at",
    "timezone",
    "dst_gap",
    "dst_repeat",
    "start_at",
    "end_at",
    "exclusions",
    "next_run_at",
    "misfire_policy",
    "max_lateness_seconds",
    "catchup_limit",
)
walk_key: Callable[[DueSchedule], tuple] = operator.itemgetter(*(DueSchedule._fields.index(f) for f in WALK_KEY_FIELDS))


def plan_schedule(schedule: DueSchedule, *, now: datetime, horizon: timedelta) -> Plan:
    """Plan the fires of `schedule` from its durable cursor up to now + horizon (docs/ARCHITECTURE.md rules 2, 7
    and 10)."""
    return walk_fires(schedule, now=now, horizon=horizon).plan_for(schedule)


def walk_fires(schedule: DueSchedule, *, now: datetime, horizon: timedelta) -> Walk:
    """The fires of `schedule`'s rule from its durable cursor up to now + horizon, each judged (rules 2 and 7).

    1. Walk fires from the cursor (never from "now": an outage must not silently drop fires) up to the horizon,
       at most fire_cap of them.
    2. Fires later than max_lateness are misfires; the policy keeps the latest K of them (skip 0, fire_once 1,
       catch_up `catchup_limit`) and records the rest missed, each with its reason.
    3. A walk cut short in the past cannot tell which of its fires are among the latest K, so it looks ahead from
       its end: if fewer than K late fires follow, the chunk ends just before the first kept one. Its fires are
       then certainly not kept (missed), and the next batch walks every kept fire in one chunk.
    4. Emitted fires get available_at = scheduled_for (strict) or + deterministic jitter (flexible); kept
       misfires are marked catch_up and released from now on, paced by the writer on the tenant's one catch-up
       budget (every schedule, batch and process of the tenant shares it). (Walk.plan_for)

    Across the batches of one catch-up at one "now", exactly min(K, late fires) are emitted. If "now" moves
    between batches, more fires are late; a fire recorded missed earlier is still not among the latest K.
    """
    rule = schedule.rule
    horizon_end = now + horizon
    lateness_limit = now - timedelta(seconds=schedule.max_lateness_seconds)
    keep = kept_late_fires(schedule)
    cap = fire_cap(schedule)
    fires: list[datetime] = []
    cursor: datetime | None = schedule.next_run_at
    once = schedule.kind == Kind.ONCE
    exclusions = schedule.exclusions
    if not exclusions:
        while cursor is not None and cursor <= horizon_end and len(fires) < cap:
            fires.append(cursor)
            # A one-off's cursor is its only fire; cron and interval rules give the next (an interval's by division).
            cursor = None if once else rule.next_after(cursor)
    else:
        # The cursor follows the rhythm; a fire the calendars exclude (as they are now) is left out as it is reached.
        # An excluded stretch is jumped over no further than the horizon: a cursor far beyond it would never come
        # back to fires that a later change of the calendars brings back.
        rhythm, zone = schedule.rhythm, parse_timezone(schedule.timezone)
        while cursor is not None and cursor <= horizon_end and len(fires) < cap:
            resume = exclusions.skip_to(cursor, zone)
            if resume is None:
                fires.append(cursor)
                cursor = None if once else rhythm.next_after(cursor)
            else:
                cursor = None if once else rhythm.next_after(min(resume, horizon_end))

    truncated_in_past = cursor is not None and cursor < lateness_limit
    if truncated_in_past and keep:
        following = _count_late_fires(schedule, cursor, lateness_limit, at_most=keep)
        if following < keep:
            # Every walked fire is late here and the chunk is full (cap > keep), so the cut keeps at least one fire:
            # the cursor always moves forward.
            cut = len(fires) - (keep - following)
            fires, cursor = fires[:cut], fires[cut]

    if not fires or fires[0] >= lateness_limit:
        # Nothing late: the ordinary case, every fire delivered at its time.
        return Walk(tuple(WalkedFire(fire, SCHEDULED) for fire in fires), cursor, now, cap)
    late = [fire for fire in fires if fire < lateness_limit]
    emitted_late = set(late[-keep:] if keep and not truncated_in_past else [])
    walked = []
    for fire in fires:
        if fire in emitted_late:
            walked.append(WalkedFire(fire, SCHEDULED, catch_up=True))
        elif fire < lateness_limit:
            walked.append(WalkedFire(fire, MISSED, _miss_reason(schedule, fire, now)))
        else:
            walked.append(WalkedFire(fire, SCHEDULED))
    return Walk(tuple(walked), cursor, now, cap, catch_up=any(fire.catch_up for fire in walked))


def _count_late_fires(schedule: DueSchedule, fire: datetime | None, lateness_limit: datetime, *, at_most: int) -> int:
    """Late fires from `fire` on, counting no further than `at_most`: the look-ahead costs at most K steps."""
    count = 0
    while fire is not None and fire < lateness_limit and count < at_most:
        count += 1
        fire = schedule.rule.next_after(fire)
    return count


def _miss_reason(schedule: DueSchedule, fire: datetime, now: datetime) -> str:
    late_by = f"late by {int((now - fire).total_seconds())} s > max lateness {schedule.max_lateness_seconds} s"
    if schedule.misfire_policy == MisfirePolicy.FIRE_ONCE:
        return f"{late_by} (fire_once keeps only the latest late fire)"
    if schedule.misfire_policy == MisfirePolicy.CATCH_UP:
        return f"{late_by} (catch_up keeps the latest {schedule.catchup_limit} late fires)"
    return f"{late_by} ({schedule.misfire_policy})"
