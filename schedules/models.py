"""Schedule (the definition), ScheduleCursor (where its materialization stands) and ScheduleVersion (the immutable
history of definitions)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q

from core.choices import DstGap, DstRepeat, Kind, Lane, MisfirePolicy, OverlapPolicy, ScheduleState
from core.exclusions import Exclusions
from core.labels import Selector
from core.shards import shard_for
from core.timerules import TimeRule

# The fields that define what a schedule does; each change to one of them is a new version.
DEFINITION_FIELDS = (
    "name",
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
    "max_runs",
    "exclude_calendars",
    "lane",
    "flexible_window_seconds",
    "priority",
    "handler",
    "payload",
    "misfire_policy",
    "max_lateness_seconds",
    "catchup_limit",
    "overlap_policy",
    "max_attempts",
    "retry_base_seconds",
    "retry_cap_seconds",
    "labels",
)

# The definition fields the materializer plans fires with, copied onto the schedule's cursor row at every save.
PLANNING_FIELDS = (
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
    "exclude_calendars",
    "lane",
    "flexible_window_seconds",
    "priority",
    "misfire_policy",
    "max_lateness_seconds",
    "catchup_limit",
)

# `Schedule.next_run_at` not assigned since the row was loaded.
_UNASSIGNED: Any = object()


class ScheduleQuerySet(models.QuerySet):
    def for_tenant(self, tenant) -> ScheduleQuerySet:
        """The one place where tenant isolation of the shared engine table is applied."""
        return self.filter(tenant=tenant)

    def selected(self, selector: Selector) -> ScheduleQuerySet:
        """The schedules whose labels meet the selector (core/labels.py): `key=value` pairs by jsonb containment,
        which the labels' GIN index serves; `key!=value` as its negation (a schedule without the key matches)."""
        queryset = self.filter(labels__contains=dict(selector.equal)) if selector.equal else self
        for key, value in selector.not_equal:
            queryset = queryset.exclude(labels__contains={key: value})
        return queryset

    def counted_by_quota(self) -> ScheduleQuerySet:
        return self.filter(state__in=[ScheduleState.ACTIVE, ScheduleState.PAUSED])

    def lock(self, pk: uuid.UUID) -> Schedule:
        """The schedule row, then its cursor row, locked until the transaction ends.

        The control plane's lock order is schedule, then cursor; the materializer locks cursor rows only, with SKIP
        LOCKED, so a change waits for at most the batch that holds the cursor, and never the other way round.
        """
        schedule = self.select_for_update().get(pk=pk)
        cursor = ScheduleCursor.objects.select_for_update().filter(schedule_id=pk).first()
        Schedule.cursor.related.set_cached_value(schedule, cursor)
        return schedule


class Schedule(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="schedules")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    cron = models.CharField(max_length=200, null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True)
    # kind "interval": fires at anchor_at + k x every_seconds (k >= 0), elapsed time. A plain integer column (no
    # CHECK of its own, as PositiveIntegerField would add): the ranges are the services', schedule_kind_has_time
    # below keeps it positive.
    every_seconds = models.IntegerField(null=True, blank=True)
    anchor_at = models.DateTimeField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    # kind "cron": what a clock change does to its wall times (core/timerules.py); null is the default, skip/first.
    dst_gap = models.CharField(max_length=8, choices=DstGap.choices, null=True, blank=True)
    dst_repeat = models.CharField(max_length=8, choices=DstRepeat.choices, null=True, blank=True)
    # Every kind: no fire before start_at or after end_at (inclusive); completed once end_at has passed and nothing
    # is pending.
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    # Only the first max_runs fires of the rhythm exist (missed ones count, manual triggers do not). The count left
    # lives on the cursor while the schedule is active (the materializer takes one per fire it writes) and here
    # while it is not (remaining_runs_now reads the right one).
    max_runs = models.PositiveIntegerField(null=True, blank=True)
    remaining_runs = models.IntegerField(null=True, blank=True, editable=False)
    # Every kind: the names of the tenant's calendars whose dates and ranges have no fire (Calendar); None is none.
    exclude_calendars = ArrayField(models.CharField(max_length=63), null=True, blank=True)
    lane = models.CharField(max_length=8, choices=Lane.choices, default=Lane.STRICT)
    flexible_window_seconds = models.PositiveIntegerField(default=300)
    priority = models.SmallIntegerField(default=0)
    handler = models.CharField(max_length=100)
    payload = models.JSONField(default=dict, blank=True)
    misfire_policy = models.CharField(max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.SKIP)
    max_lateness_seconds = models.PositiveIntegerField(default=60)
    catchup_limit = models.PositiveIntegerField(default=10)
    overlap_policy = models.CharField(max_length=16, choices=OverlapPolicy.choices, default=OverlapPolicy.ALLOW)
    max_attempts = models.PositiveSmallIntegerField(default=5)
    # How long a transient failure waits before the next attempt (dispatch/engine/retry.py: equal jitter between
    # half and all of min(cap, base * 2**(attempt-1))); None: the platform's SCHEDULER_RETRY_*_SECONDS. Plain integer
    # columns: a CHECK would make adding them scan the whole table under its lock; the ranges are the services'.
    retry_base_seconds = models.IntegerField(
        null=True,
        blank=True,
        help_text="Seconds; the first retry waits between half and all of it. Empty: the platform's default.",
    )
    retry_cap_seconds = models.IntegerField(
        null=True,
        blank=True,
        help_text=(
            "The longest backoff between attempts, in seconds (the tenant's retry budget may delay a retry further). "
            "Empty: the platform's default."
        ),
    )
    # The tenant's own key/value tags (core/labels.py), chosen by selectors in lists, bulk changes, export/apply and
    # notifications. A database default, so raw inserts (the benchmarks' COPY) need not name it.
    labels = models.JSONField(default=dict, blank=True, db_default={})

    state = models.CharField(max_length=10, choices=ScheduleState.choices, default=ScheduleState.ACTIVE)
    # While paused: when it resumes by itself (the materializer's maintenance pass, schedules.services
    # resume_due_pauses); None otherwise.
    resume_at = models.DateTimeField(null=True, blank=True, editable=False)
    version = models.PositiveIntegerField(default=1)
    # The UTC cursor (next_run_at, below) lives in ScheduleCursor.
    shard = models.PositiveIntegerField(editable=False)

    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # Hash of the create request body, so a retried key with a different body is recognised (409).
    request_fingerprint = models.CharField(max_length=64, null=True, blank=True)
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "id"]
        indexes = [
            # Quota counts and the API list (newest first) of one tenant.
            models.Index(fields=["tenant", "state"], name="schedule_tenant_state"),
            models.Index(fields=["tenant", "-created_at"], name="schedule_tenant_created"),
            # The operator console's unfiltered list (newest first) over every tenant.
            models.Index(fields=["-created_at", "id"], name="schedule_created_desc"),
            # The console's list, tenant first then by name, so a busy tenant's schedules do not bury the others'.
            models.Index(fields=["tenant", "name", "id"], name="schedule_tenant_name"),
            # The pauses due to end: a few rows among millions, found by the maintenance pass.
            models.Index(fields=["resume_at"], name="schedule_resume_due", condition=Q(resume_at__isnull=False)),
            # Selectors' `key=value` pairs: jsonb containment (labels @> {...}), beside the tenant's own index.
            GinIndex(fields=["labels"], opclasses=["jsonb_path_ops"], name="schedule_labels"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="schedule_unique_idempotency_key",
            ),
            models.CheckConstraint(condition=Q(priority__gte=-100, priority__lte=100), name="schedule_priority_range"),
            # An interval's period is checked positive here too: the materializer divides by it. (A NULL period
            # is excluded explicitly: a CHECK whose expression is NULL passes.)
            models.CheckConstraint(
                condition=(
                    Q(kind="cron", cron__isnull=False)
                    | Q(kind="once", run_at__isnull=False)
                    | Q(kind="interval", every_seconds__isnull=False, every_seconds__gte=1, anchor_at__isnull=False)
                ),
                name="schedule_kind_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    def save(self, *args, **kwargs) -> None:
        """Save the definition and, in the same transaction, its cursor row (ScheduleCursor.follow)."""
        if self.shard is None:
            self.shard = shard_for(self.id)
        super().save(*args, **kwargs)
        ScheduleCursor.follow(self, self.__dict__.pop("_next_run_at", _UNASSIGNED))

    @property
    def next_run_at(self) -> datetime | None:
        """The UTC cursor: the next fire not yet materialized; None when nothing is pending (paused, canceled,
        completed, or a one-off whose fire was materialized). Read from the cursor row; assign it to move the
        cursor, and save() writes it."""
        if "_next_run_at" in self.__dict__:
            return self.__dict__["_next_run_at"]
        try:
            return self.cursor.next_run_at
        except ScheduleCursor.DoesNotExist:
            return None

    @next_run_at.setter
    def next_run_at(self, value: datetime | None) -> None:
        self.__dict__["_next_run_at"] = value

    @property
    def remaining_runs_now(self) -> int | None:
        """Fires left under max_runs: the cursor's count while active, the schedule's own otherwise (None: no
        limit). Fires are counted when the materializer writes them, up to its horizon before they are due."""
        if self.max_runs is None:
            return None
        if self.state == ScheduleState.ACTIVE:
            try:
                cursor = self.cursor
            except ScheduleCursor.DoesNotExist:
                cursor = None
            if cursor is not None and cursor.remaining_runs is not None:
                return cursor.remaining_runs
        return self.remaining_runs

    @property
    def rhythm(self) -> TimeRule:
        """The time rule without the calendars: what the cursor follows. The materializer leaves out the fires the
        calendars exclude as it reaches them, so a calendar changed later applies to every fire not yet written
        (a cursor that had jumped over excluded fires would never come back to them)."""
        return TimeRule(
            kind=self.kind,
            timezone=self.timezone,
            cron=self.cron,
            run_at=self.run_at,
            every_seconds=self.every_seconds,
            anchor_at=self.anchor_at,
            dst_gap=self.dst_gap,
            dst_repeat=self.dst_repeat,
            start_at=self.start_at,
            end_at=self.end_at,
        )

    @property
    def time_rule(self) -> TimeRule:
        """The fires that exist: the rhythm less what its calendars exclude, as they are now (one query when the
        schedule names calendars)."""
        rule = self.rhythm
        exclusions = Calendar.objects.exclusions(self.tenant_id, self.exclude_calendars)
        return dataclasses.replace(rule, exclusions=exclusions) if exclusions is not None else rule

    def definition(self) -> dict:
        """JSON snapshot of the definition and state, as stored in ScheduleVersion."""
        snapshot = {field: getattr(self, field) for field in DEFINITION_FIELDS}
        snapshot["run_at"] = self.run_at.isoformat() if self.run_at else None
        for field in ("anchor_at", "start_at", "end_at"):
            value = getattr(self, field)
            snapshot[field] = value.isoformat() if value else None
        snapshot["state"] = self.state
        # The runs left when the version began: reconcile expects at most that many of its fires.
        snapshot["remaining_runs"] = self.remaining_runs
        return snapshot


class ScheduleCursor(models.Model):
    """Where the materialization of an active schedule stands: its next fire not yet materialized (UTC), with the
    definition the materializer plans from, copied from the schedule at every save.

    A table of its own because the materializer moves one cursor per fire, 500,000 of them before a busy hour. On
    the schedule row each move rewrote a wide row (payload and all) and added an entry to each of its six indexes;
    a cursor row is ~150 bytes with two indexes (docs/DESIGN.md, "The materializer's batch, and the cursor table").
    A row exists while the schedule is active, and only then. next_run_at is NULL once a one-off's only fire is
    materialized: the maintenance pass completes the schedule when that occurrence has ended.

    Writers: Schedule.save() (the control plane, holding the schedule's row lock and then this one) and the
    materializer (dispatch/sql/materialize.py), which locks cursor rows only, with SKIP LOCKED.
    """

    schedule = models.OneToOneField(Schedule, primary_key=True, on_delete=models.CASCADE, related_name="cursor")
    tenant_id = models.BigIntegerField()
    shard = models.PositiveIntegerField()
    version = models.PositiveIntegerField()
    next_run_at = models.DateTimeField(null=True, blank=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    cron = models.CharField(max_length=200, null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True)
    every_seconds = models.IntegerField(null=True, blank=True)
    anchor_at = models.DateTimeField(null=True, blank=True)
    timezone = models.CharField(max_length=64)
    dst_gap = models.CharField(max_length=8, choices=DstGap.choices, null=True, blank=True)
    dst_repeat = models.CharField(max_length=8, choices=DstRepeat.choices, null=True, blank=True)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    # Fires still to be written under max_runs (None: no limit). The materializer takes one per fire it writes, the
    # control plane sets it at every version (never copied by a plain save: the materializer may have moved it).
    remaining_runs = models.IntegerField(null=True, blank=True)
    exclude_calendars = ArrayField(models.CharField(max_length=63), null=True, blank=True)
    lane = models.CharField(max_length=8, choices=Lane.choices)
    flexible_window_seconds = models.PositiveIntegerField()
    priority = models.SmallIntegerField()
    misfire_policy = models.CharField(max_length=16, choices=MisfirePolicy.choices)
    max_lateness_seconds = models.PositiveIntegerField()
    catchup_limit = models.PositiveIntegerField()

    class Meta:
        indexes = [
            # The materializer's scan: due cursors of one shard in time order, and at one instant by tenant, so every
            # shard hands a batch the same tenants' fires and a burst's tenant is one envelope (dispatch/sql/
            # materialize.py SCAN_DUE_SCHEDULES).
            models.Index(
                fields=["shard", "next_run_at", "tenant_id"],
                name="cursor_due_by_shard_tenant",
                condition=Q(next_run_at__isnull=False),
            ),
            # The one-offs whose fire was materialized and may still run: the maintenance pass completes them.
            models.Index(fields=["schedule"], name="cursor_fired_one_off", condition=Q(next_run_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} v{self.version} at {self.next_run_at}"

    @staticmethod
    def follow(schedule: Schedule, next_run_at: datetime | None) -> None:
        """Bring the cursor row in step with a saved schedule.

        With `next_run_at` assigned (a create or a new version): an active schedule's row is written whole, any
        other's is deleted. Without: an active schedule's row gets the saved definition and version, its position
        untouched (the materializer may have moved it since this instance was loaded).
        """
        descriptor = Schedule.cursor.related
        if next_run_at is _UNASSIGNED:
            if schedule.state == ScheduleState.ACTIVE:
                ScheduleCursor.objects.filter(schedule_id=schedule.pk).update(
                    version=schedule.version, **{field: getattr(schedule, field) for field in PLANNING_FIELDS}
                )
                if descriptor.is_cached(schedule):
                    descriptor.delete_cached_value(schedule)
            return
        if schedule.state != ScheduleState.ACTIVE:
            ScheduleCursor.objects.filter(schedule_id=schedule.pk).delete()
            descriptor.set_cached_value(schedule, None)
            return
        cursor = ScheduleCursor(
            schedule=schedule,
            tenant_id=schedule.tenant_id,
            shard=schedule.shard,
            version=schedule.version,
            next_run_at=next_run_at,
            remaining_runs=schedule.remaining_runs,
            **{field: getattr(schedule, field) for field in PLANNING_FIELDS},
        )
        updated = ["tenant_id", "shard", "version", "next_run_at", "remaining_runs", *PLANNING_FIELDS]
        ScheduleCursor.objects.bulk_create(
            [cursor], update_conflicts=True, unique_fields=["schedule"], update_fields=updated
        )
        descriptor.set_cached_value(schedule, cursor)


class VersionChange(models.TextChoices):
    CREATE = "create"
    UPDATE = "update"
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"


class ScheduleVersion(models.Model):
    """One immutable version of a schedule: what it was, from when to when, and who made it.

    The reconciler recomputes expected fires from these rows and the time rules alone, so a version is never
    edited after the fact: only `valid_to` is set, once, when the next version starts.
    """

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="versions")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    version = models.PositiveIntegerField()
    change = models.CharField(max_length=10, choices=VersionChange.choices)
    definition = models.JSONField()
    valid_from = models.DateTimeField()
    valid_to = models.DateTimeField(null=True, blank=True)
    actor = models.CharField(max_length=200, help_text="Who made the change, e.g. 'tenant:acme/api'.")
    # Why, in the actor's words ("paused: upstream API down until Monday"); a database default, so raw inserts
    # (the benchmarks' COPY) need not name it.
    note = models.TextField(blank=True, default="", db_default="")

    class Meta:
        ordering = ["schedule", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "version"], name="schedule_version_unique"),
        ]
        indexes = [models.Index(fields=["tenant", "valid_from"], name="schedule_version_tenant_from")]

    def __str__(self) -> str:
        return f"{self.schedule_id} v{self.version} ({self.change})"


class CalendarQuerySet(models.QuerySet):
    def exclusions(self, tenant_id: int, names: list[str] | None) -> Exclusions | None:
        """The merged exclusions of the tenant's calendars `names` as they are now (a name without a calendar
        excludes nothing: one in use cannot be deleted); None when no name is given."""
        if not names:
            return None
        calendars = self.filter(tenant_id=tenant_id, name__in=names)
        return Exclusions.merged(Exclusions.stored(c.dates, c.ranges) for c in calendars)


class Calendar(models.Model):
    """A tenant's named set of dates and ranges on which the schedules that name it do not fire (holidays,
    maintenance windows). A date is excluded in each schedule's own zone; a range [start, end) is in instants.
    Each change is also kept as a CalendarRevision: reconcile and backfill judge each fire by what the calendar
    said when the fire was materialized."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="calendars")
    name = models.CharField(max_length=63)
    # ISO dates ("2026-12-25"), sorted; ranges {"start", "end"} as ISO instants in UTC, sorted.
    dates = models.JSONField(default=list, blank=True)
    ranges = models.JSONField(default=list, blank=True)
    description = models.CharField(max_length=500, blank=True, default="")
    revision = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = CalendarQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="calendar_unique_name")]

    def __str__(self) -> str:
        return self.name


class CalendarRevision(models.Model):
    """One content a calendar had, from valid_from to valid_to (None: still in force). Kept after the calendar is
    deleted, by tenant and name: older schedule versions name it, and their fires are judged by it."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=63)
    revision = models.PositiveIntegerField()
    dates = models.JSONField()
    ranges = models.JSONField()
    valid_from = models.DateTimeField()
    valid_to = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "name", "valid_from"]
        indexes = [models.Index(fields=["tenant", "name", "valid_from"], name="calendar_revision_by_name")]

    def __str__(self) -> str:
        return f"{self.name} r{self.revision}"
