"""Occurrence (one fire of a schedule), Attempt (one claim of it by a worker), the outbox of envelopes and the
shard leases of the materializers.

Occurrences and attempts arrive at about 200 M a day, so both tables are range-partitioned by day in
PostgreSQL (see migration 0001 and dispatch/partitions.py): old days are dropped whole instead of being deleted
row by row and vacuumed. Django sees ordinary models; the partitioned layout lives in the migration's SQL.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now
from django.db.models.lookups import LessThanOrEqual

from dispatch.sql.outbox import SMALL_ENVELOPE_FIRES


class OccurrenceState(models.TextChoices):
    SCHEDULED = "scheduled"
    ENQUEUED = "enqueued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    RETRY_WAIT = "retry_wait"
    DEAD = "dead"
    MISSED = "missed"
    CANCELED = "canceled"
    SKIPPED_OVERLAP = "skipped_overlap"


# Not yet claimed by a worker: a newer schedule version or a cancel may still withdraw these.
UNCLAIMED_STATES = (OccurrenceState.SCHEDULED, OccurrenceState.ENQUEUED, OccurrenceState.RETRY_WAIT)
# Already handed to a worker: may still run, whatever happens to the schedule now.
IN_FLIGHT_STATES = (OccurrenceState.RUNNING,)
TERMINAL_STATES = (
    OccurrenceState.SUCCEEDED,
    OccurrenceState.DEAD,
    OccurrenceState.MISSED,
    OccurrenceState.CANCELED,
    OccurrenceState.SKIPPED_OVERLAP,
)


class OccurrenceQuerySet(models.QuerySet):
    def for_tenant(self, tenant) -> OccurrenceQuerySet:
        """The one place where tenant isolation of the shared occurrence table is applied."""
        return self.filter(tenant=tenant)


class Occurrence(models.Model):
    """One fire. Its id is derived from (schedule, version, scheduled_for), so every path that creates the same
    fire (materializer, failover, backfill) meets the same row. The database key is (occurrence_id,
    scheduled_for) because a partitioned table's keys must contain the partition column."""

    occurrence_id = models.UUIDField(primary_key=True, editable=False)
    # No database foreign keys: they would cost an index probe per row at the top-of-hour insert, and
    # schedules are never hard-deleted (cancel is soft).
    schedule = models.ForeignKey(
        "schedules.Schedule", on_delete=models.DO_NOTHING, db_constraint=False, related_name="occurrences"
    )
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    schedule_version = models.PositiveIntegerField()
    scheduled_for = models.DateTimeField()
    available_at = models.DateTimeField()
    lane = models.CharField(max_length=8)
    priority = models.SmallIntegerField(default=0)
    manual = models.BooleanField(default=False, help_text="Fired by POST .../trigger/, outside the cron rhythm.")
    # Set by backfill and replay: an operator asked for this very fire, so the worker runs it even when the
    # schedule has moved to a newer version since (a canceled schedule still wins).
    forced = models.BooleanField(default=False)
    # Already due when its schedule changed version: it keeps its slot through that change (not withdrawn), but
    # unlike a forced one it still meets the misfire policy and the deadline at claim (nobody asked for it late).
    kept = models.BooleanField(default=False, db_default=False)
    # Published late because its tenant's max_fires_per_second was spent: lateness the tenant's own quota caused,
    # reported apart from the platform's lag.
    throttled = models.BooleanField(default=False, db_default=False)
    state = models.CharField(max_length=16, choices=OccurrenceState.choices, default=OccurrenceState.SCHEDULED)
    # Why the occurrence is in its state when that is not obvious: which rule made it missed, skipped or canceled,
    # in words an operator can act on ("late by 612 s > max lateness 60 s (skip)"). Empty for the ordinary path;
    # a database default, so the raw multi-row inserts of the hot path need not name it.
    state_reason = models.TextField(blank=True, db_default="")
    # Doubles as the fencing generation: a claim increments it; completion must present the same number.
    attempt_count = models.PositiveSmallIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OccurrenceQuerySet.as_manager()

    class Meta:
        ordering = ["-scheduled_for"]

    def __str__(self) -> str:
        return f"{self.occurrence_id} {self.state}"


# The states the engine looks occurrences up by: the lease reaper and the overlap checks (running, retry_wait), the
# dead-letter queue (dead). OccurrenceWatch holds the occurrences in them.
WATCHED_STATES = (OccurrenceState.RUNNING, OccurrenceState.RETRY_WAIT, OccurrenceState.DEAD)


class OccurrenceWatch(models.Model):
    """An occurrence in one of WATCHED_STATES, with what its readers look it up by: a small table kept by triggers
    on the occurrence table (migration 0017), in the same transaction as the occurrence's change.

    An index in all but name, kept outside the occurrence table so that no index there names state or lease: a
    change of state is then a HOT update, which writes no index entry (docs/DESIGN.md, "State changes that stay on
    their page"). Read it, never write it: every writer of occurrences keeps it by writing the occurrence."""

    occurrence_id = models.UUIDField(primary_key=True, editable=False)  # the database key adds scheduled_for
    scheduled_for = models.DateTimeField()
    schedule_id = models.UUIDField()
    tenant_id = models.BigIntegerField()
    state = models.CharField(max_length=16)
    attempt_count = models.SmallIntegerField()
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "dispatch_occurrence_watch"

    def __str__(self) -> str:
        return f"{self.occurrence_id} {self.state}"


class OccurrenceResolution(models.Model):
    """An operator's decision that a dead occurrence needs nothing more (dispatch/dlq.py): who, when and why.

    It holds for the death it was made for: while the occurrence is still dead at the generation it died at
    (`attempt_count`), it is out of the dead-letter queue. Its state stays dead (the API, reconcile and the
    notifications know no other state), its attempts stay; a replay runs it again under the same id, and should that
    run die too, the occurrence is back in the queue while this row stays as its history. A table of its own rather
    than columns of the occurrence: adding them would lock every day partition of the hot table, and a replay would
    have to clear them (docs/DESIGN.md, "Resolving from the DLQ")."""

    id = models.BigAutoField(primary_key=True)
    occurrence_id = models.UUIDField()
    # The occurrence's partition key: finds its row, and the resolution leaves with its day (dispatch/partitions.py).
    scheduled_for = models.DateTimeField()
    attempt_count = models.PositiveSmallIntegerField()
    tenant_id = models.BigIntegerField()
    resolved_at = models.DateTimeField()
    resolved_by = models.CharField(max_length=200)
    note = models.TextField()

    class Meta:
        db_table = "dispatch_occurrence_resolution"
        ordering = ["resolved_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["occurrence_id", "scheduled_for", "attempt_count"], name="resolution_once_per_death"
            ),
        ]
        indexes = [models.Index(fields=["scheduled_for"], name="resolution_by_day")]

    def __str__(self) -> str:
        return f"{self.occurrence_id} resolved by {self.resolved_by}"


class OccurrenceRerun(models.Model):
    """An operator's re-run of a fire that did not run (dispatch/rerun.py): who, when and why, and the judgement it
    set aside (the state and reason the row had), which the occurrence row itself forgets once it runs.

    A table of its own, like OccurrenceResolution and for the same reasons: no column to add to the hot partitioned
    table, and the row leaves with its day (dispatch/sql/maintenance.py)."""

    id = models.BigAutoField(primary_key=True)
    occurrence_id = models.UUIDField()
    # The occurrence's partition key: finds its row, and the re-run leaves with its day.
    scheduled_for = models.DateTimeField()
    tenant_id = models.BigIntegerField()
    previous_state = models.CharField(max_length=16)
    previous_reason = models.TextField(blank=True, default="")
    rerun_at = models.DateTimeField()
    rerun_by = models.CharField(max_length=200)
    note = models.TextField()

    class Meta:
        db_table = "dispatch_occurrence_rerun"
        ordering = ["rerun_at"]
        indexes = [
            # An occurrence's timeline reads its re-runs by its key; the retention deletes a day's.
            models.Index(fields=["occurrence_id", "scheduled_for"], name="rerun_by_occurrence"),
            models.Index(fields=["scheduled_for"], name="rerun_by_day"),
        ]

    def __str__(self) -> str:
        return f"{self.occurrence_id} re-run by {self.rerun_by}"


class Attempt(models.Model):
    """One claim of an occurrence by a worker. `generation` fences late completions of older claims."""

    id = models.BigAutoField(primary_key=True)
    occurrence = models.ForeignKey(
        Occurrence, on_delete=models.DO_NOTHING, db_constraint=False, related_name="attempts"
    )
    # The occurrence's partition key, repeated so a day's attempts are dropped with that day's occurrences.
    scheduled_for = models.DateTimeField()
    generation = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True, default="")
    error_class = models.CharField(max_length=16, blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["generation"]
        constraints = [
            # One attempt per fencing generation. The table is partitioned by scheduled_for, so the key holds it
            # too (migration 0005 builds it partition by partition without blocking inserts).
            models.UniqueConstraint(
                fields=["occurrence", "scheduled_for", "generation"], name="attempt_generation_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.occurrence_id} #{self.generation}"


def _small_envelope() -> LessThanOrEqual:
    """An envelope of the settler's small class (dispatch/sql/outbox.py SMALL_ENVELOPE), as an index condition."""
    fires = models.Func(models.F("occurrence_ids"), function="cardinality", output_field=models.IntegerField())
    return LessThanOrEqual(fires, SMALL_ENVELOPE_FIRES)


class OutboxMessage(models.Model):
    """One AMQP message waiting to be published: an envelope of up to SCHEDULER_ENVELOPE_SIZE occurrences of one
    tenant, lane, instant and priority, its body serialised when the occurrences were materialized.

    The relay publishes it with a broker confirm and then stamps `published_at`, one row per envelope rather than
    one UPDATE per occurrence at the hot instant; settling copies that stamp onto the occurrences afterwards.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.BigIntegerField()
    queue = models.CharField(max_length=64)
    available_at = models.DateTimeField()
    priority = models.SmallIntegerField(default=0)
    occurrence_ids = ArrayField(models.UUIDField())
    scheduled_fors = ArrayField(models.DateTimeField())
    body = models.BinaryField()
    published_at = models.DateTimeField(null=True, blank=True)
    # Set when the relay passed the envelope over at its instant because its tenant's fire rate was spent
    # (max_fires_per_second); settling copies it onto the occurrences, so throttled lateness is told apart from lag.
    throttled = models.BooleanField(default=False, db_default=False)
    # The relay publishing it now (its process name, as its connection's application_name) and until when: set by
    # the claim's short transaction, so no transaction stays open while messages are in flight. Only the lease
    # holder stamps the row; an expired lease, or one of a relay no longer connected, is taken over (docs/DESIGN.md
    # "Relay leases").
    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Publishes the broker refused (nacked or returned) in a row, and when the next may be tried: every relay honours
    # the backoff, so a queue that refuses everything is retried a few times a minute, not every step.
    publish_failures = models.PositiveIntegerField(default=0, db_default=0)
    retry_at = models.DateTimeField(null=True, blank=True)
    # PostgreSQL's clock, as a default: the materializer writes envelopes by COPY, which names no function.
    created_at = models.DateTimeField(
        db_default=models.Func(function="clock_timestamp", output_field=models.DateTimeField())
    )

    class Meta:
        indexes = [
            # The earliest unpublished envelope (the relay's nap) and the metrics' outbox age.
            models.Index(
                fields=["available_at", "-priority"],
                name="outbox_due",
                condition=models.Q(published_at__isnull=True),
            ),
            # The relay's fair claim: per lane and tenant, unpublished envelopes in (time, priority) order.
            models.Index(
                fields=["queue", "tenant_id", "available_at", "-priority", "id"],
                name="outbox_due_by_tenant",
                condition=models.Q(published_at__isnull=True),
            ),
            # The settler's scans: published envelopes whose stamp is not yet on their occurrences, one index per class
            # of envelope (dispatch/sql/outbox.py SMALL_ENVELOPE: each class's scan walks only its own).
            models.Index(
                fields=["published_at"],
                name="outbox_published_small",
                condition=models.Q(published_at__isnull=False) & models.Q(_small_envelope()),
            ),
            models.Index(
                fields=["published_at"],
                name="outbox_published_big",
                condition=models.Q(published_at__isnull=False) & ~models.Q(_small_envelope()),
            ),
        ]

    def __str__(self) -> str:
        return f"envelope {self.id} ({len(self.occurrence_ids)} occurrences at {self.available_at})"


class ShardLease(models.Model):
    """Which materializer owns a shard, until when. `generation` grows on every change of owner, so a batch
    committed under an old generation is refused (fencing)."""

    shard = models.PositiveIntegerField(primary_key=True)
    owner = models.CharField(max_length=200, blank=True, default="")
    generation = models.BigIntegerField(default=0)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"shard {self.shard} -> {self.owner or '-'} g{self.generation}"


class ProcessHeartbeat(models.Model):
    """A live materializer, relay or worker process; the fair share of shards counts the live materializers."""

    name = models.CharField(max_length=200, primary_key=True)
    role = models.CharField(max_length=20)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    # The process's wall clock minus PostgreSQL's when it wrote its heartbeat (late by the one-way network delay):
    # decisions use PostgreSQL's clock, this finds a host whose clock is off before its logs mislead anyone.
    clock_skew_seconds = models.FloatField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.role} {self.name}"


class Notification(models.Model):
    """One event a tenant is told of (docs/API.md, "Notifications"): written by the occurrence table's triggers
    (dispatch migration 0020) or the stuck search, once per (event, occurrence), and sent at least once by a
    worker's NotificationSender (dispatch/notifications.py)."""

    tenant_id = models.BigIntegerField()
    event = models.CharField(max_length=20)
    occurrence_id = models.UUIDField()
    scheduled_for = models.DateTimeField()
    schedule_id = models.UUIDField()
    state = models.CharField(max_length=16)
    state_reason = models.TextField(blank=True, db_default="")
    created_at = models.DateTimeField(db_default=Now())
    # When a sender may take it next: now for a new one; a sender that takes it moves this ahead as its lease, so
    # one that dies mid-send leaves it to another after that.
    next_attempt_at = models.DateTimeField(db_default=Now())
    # Which take holds it: every record of a send names it, so a sender whose lease ran out records nothing.
    lease = models.UUIDField(null=True, blank=True)
    attempts = models.IntegerField(db_default=0)
    first_tried_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    given_up_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, db_default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["event", "occurrence_id"], name="notification_once_per_event"),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="notification_due",
                condition=models.Q(delivered_at__isnull=True, given_up_at__isnull=True),
            ),
            # A tenant's delivery state (GET /api/v1/notifications/), and the retention's deletes.
            models.Index(fields=["tenant_id", "next_attempt_at"], name="notification_by_tenant"),
            models.Index(fields=["created_at"], name="notification_by_age"),
        ]

    def __str__(self) -> str:
        return f"{self.event} of {self.occurrence_id}"
