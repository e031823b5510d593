"""The choices both planes speak of: a schedule's kind, lane, misfire and overlap policies and state.

The control plane stores them on a schedule (schedules/models.py); the data plane decides by them (dispatch/engine/).
"""

from __future__ import annotations

from django.db import models


class Kind(models.TextChoices):
    CRON = "cron"
    ONCE = "once"
    INTERVAL = "interval"


class Lane(models.TextChoices):
    STRICT = "strict"
    FLEXIBLE = "flexible"


class MisfirePolicy(models.TextChoices):
    SKIP = "skip"
    FIRE_ONCE = "fire_once"
    CATCH_UP = "catch_up"


class OverlapPolicy(models.TextChoices):
    ALLOW = "allow"
    SKIP_IF_RUNNING = "skip_if_running"
    QUEUE_ONE = "queue_one"


class DstGap(models.TextChoices):
    """What a cron schedule does with a wall time the clocks skip (core/timerules.py); null on a schedule is SKIP."""

    SKIP = "skip"
    SHIFT = "shift"


class DstRepeat(models.TextChoices):
    """Which instants of a wall time the clocks repeat a cron schedule fires at; null on a schedule is FIRST."""

    FIRST = "first"
    LAST = "last"
    BOTH = "both"


class ScheduleState(models.TextChoices):
    ACTIVE = "active"
    PAUSED = "paused"
    CANCELED = "canceled"
    COMPLETED = "completed"
