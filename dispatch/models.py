"""Occurrence (one fire of a schedule), Attempt (one try at running it) and the transactional outbox."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


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
    occurrence_id = models.UUIDField(primary_key=True, editable=False)
    schedule = models.ForeignKey("schedules.Schedule", on_delete=models.CASCADE, related_name="occurrences")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    schedule_version = models.PositiveIntegerField()
    scheduled_for = models.DateTimeField()
    available_at = models.DateTimeField()
    lane = models.CharField(max_length=8)
    priority = models.SmallIntegerField(default=0)
    manual = models.BooleanField(
        default=False, help_text="Fired by POST .../trigger/, outside the cron rhythm."
    )
    state = models.CharField(
        max_length=16, choices=OccurrenceState.choices, default=OccurrenceState.SCHEDULED
    )
    attempt_count = models.PositiveSmallIntegerField(default=0)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OccurrenceQuerySet.as_manager()

    class Meta:
        ordering = ["-scheduled_for"]
        constraints = [
            # The idempotency of materialization: two materializers during a lease hand-over leave one row.
            models.UniqueConstraint(
                fields=["schedule", "schedule_version", "scheduled_for"],
                condition=Q(manual=False),
                name="occurrence_unique_fire",
            ),
        ]
        indexes = [
            models.Index(fields=["schedule", "-scheduled_for"], name="occurrence_schedule_recent"),
            models.Index(fields=["tenant", "state"], name="occurrence_tenant_state"),
        ]

    def __str__(self) -> str:
        return f"{self.occurrence_id} {self.state}"


class Attempt(models.Model):
    """One claim of an occurrence by a worker. `generation` fences late completions of older claims."""

    occurrence = models.ForeignKey(Occurrence, on_delete=models.CASCADE, related_name="attempts")
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
            models.UniqueConstraint(fields=["occurrence", "generation"], name="attempt_unique_generation"),
        ]

    def __str__(self) -> str:
        return f"{self.occurrence_id} #{self.generation}"


class OutboxMessage(models.Model):
    """An occurrence waiting to be published. Written in the same transaction as the occurrence; deleted by the
    relay only after the broker confirmed it (publish, then forget)."""

    id = models.BigAutoField(primary_key=True)
    occurrence_id = models.UUIDField()
    tenant_id = models.BigIntegerField()
    queue = models.CharField(max_length=64)
    available_at = models.DateTimeField()
    priority = models.SmallIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["available_at", "-priority"], name="outbox_due")]

    def __str__(self) -> str:
        return f"outbox {self.occurrence_id} at {self.available_at}"
