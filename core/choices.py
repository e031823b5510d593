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


class ScheduleState(models.TextChoices):
    ACTIVE = "active"
    PAUSED = "paused"
    CANCELED = "canceled"
    COMPLETED = "completed"
