"""A real worker process sends notifications by itself: its NotificationSender thread (started when the worker is
ready) finds a missed fire's notification and delivers it, signed, while the worker also runs envelopes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.clock import db_now
from dispatch.models import Notification, Occurrence, OccurrenceState
from tenants.notifications import set_target
from tests.conftest import occurrence_for, schedule_for
from tests.integration.test_worker_process import start_worker, tenant  # noqa: F401 - fixtures: the worker; its queues made empty
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_running_worker_delivers_a_missed_fires_notification(tenant, target, start_worker):  # noqa: F811
    set_target(tenant, url=f"{target.url}/alerts", events=["missed"], selector=None, actor="test", now=db_now())
    schedule = schedule_for(tenant, name="nightly")
    at = db_now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    missed = occurrence_for(schedule, at=at)
    Occurrence.objects.filter(pk=missed.pk).update(state=OccurrenceState.MISSED, state_reason="too late")

    start_worker()

    wait_for(lambda: len(target.received) >= 1, 30, "the worker's notification sender to deliver")
    (alert,) = target.received
    assert (alert.path, alert.body["event"], alert.body["occurrence_id"]) == (
        "/alerts",
        "missed",
        str(missed.occurrence_id),
    )
    assert alert.headers["webhook-signature"].startswith("v1,")
    wait_for(lambda: Notification.objects.filter(delivered_at__isnull=False).count() == 1, 10, "it to be recorded")
