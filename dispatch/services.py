"""The data plane's one door for the control plane.

`schedules/` (its verbs, the API, the console) and `tenants/` ask the data plane for nothing but what is named here,
and read nothing of it but its models: the handlers a schedule may name, the occurrences a change withdraws or still
owes, a manual trigger, a replay from the DLQ or its resolution, a re-run of a missed or skipped fire, a backfill,
what is in flight or pending, the materializer's rule for a late one-off, a deleted tenant's end of work, the
tenants' quota counters, the URL rule of outbound calls and how a tenant's notifications are faring. Each name is
the function that does the work, in the module that owns it; this file is where a reader of the control plane learns
what the data plane offers, and where a change of that offer shows.
"""

from __future__ import annotations

from dispatch.backfill import BackfillResult, backfill_schedule
from dispatch.dlq import resolve_dead_occurrence
from dispatch.errors import BackfillRefused, ReconcileInputError, ReplayRefused, ResolveRefused
from dispatch.handlers import is_registered, payload_problems, registered_names
from dispatch.handlers.webhook import url_problems
from dispatch.notifications import NotificationDelivery, notification_delivery
from dispatch.occurrences import (
    EndedWork,
    InFlight,
    earliest_pending_fire,
    end_tenant_work,
    fires_written_after,
    in_flight_occurrences,
    invalidate_unclaimed_occurrences,
    materialize_owed_fires,
    pending_fires,
    record_missed_fire,
    replay_dead_occurrence,
    schedules_of_tenant,
    trigger_manual_occurrence,
)
from dispatch.planning import late_one_off_fires
from dispatch.quotas import tenant_quota_columns
from dispatch.rerun import RerunRefused, rerun_occurrence

__all__ = [
    "BackfillRefused",
    "BackfillResult",
    "EndedWork",
    "InFlight",
    "NotificationDelivery",
    "ReconcileInputError",
    "ReplayRefused",
    "RerunRefused",
    "ResolveRefused",
    "backfill_schedule",
    "earliest_pending_fire",
    "end_tenant_work",
    "fires_written_after",
    "in_flight_occurrences",
    "invalidate_unclaimed_occurrences",
    "is_registered",
    "late_one_off_fires",
    "materialize_owed_fires",
    "notification_delivery",
    "payload_problems",
    "pending_fires",
    "record_missed_fire",
    "registered_names",
    "replay_dead_occurrence",
    "rerun_occurrence",
    "resolve_dead_occurrence",
    "schedules_of_tenant",
    "tenant_quota_columns",
    "trigger_manual_occurrence",
    "url_problems",
]
