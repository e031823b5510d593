"""An occurrence's timeline in words (dispatch/timeline.py), from unsaved rows and an explicit `now`: each delay is
put down to what caused it, and no duration reads as negative."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from dispatch.models import Attempt, Occurrence, OccurrenceState
from dispatch.timeline import Event, occurrence_timeline, offset_text

FIRE = datetime(2026, 12, 2, 4, 51, tzinfo=UTC)
NOW = FIRE + timedelta(minutes=5)


def occurrence(**fields) -> Occurrence:
    row = {
        "occurrence_id": uuid.UUID("6f1c2b1e-0000-4000-8000-000000000001"),
        "schedule_id": uuid.UUID("6f1c2b1e-0000-4000-8000-000000000002"),
        "tenant_id": 1,
        "schedule_version": 1,
        "scheduled_for": FIRE,
        "available_at": FIRE,
        "lane": "strict",
        "state": OccurrenceState.SUCCEEDED,
        "created_at": FIRE - timedelta(minutes=1),
        # Columns with database defaults: an unsaved row holds a placeholder for them until given a value.
        "state_reason": "",
        "kept": False,
        "throttled": False,
        **fields,
    }
    return Occurrence(**row)


def attempt(generation: int, started: float, finished: float | None, outcome: str = "succeeded") -> Attempt:
    return Attempt(
        occurrence_id=uuid.UUID("6f1c2b1e-0000-4000-8000-000000000001"),
        scheduled_for=FIRE,
        generation=generation,
        worker="worker-1",
        started_at=FIRE + timedelta(seconds=started),
        finished_at=None if finished is None else FIRE + timedelta(seconds=finished),
        outcome=outcome if finished is not None else "",
    )


def event(events: list[Event], label: str) -> Event:
    return next(e for e in events if e.label.startswith(label))


def test_offsets_say_before_or_after_instead_of_a_sign():
    assert offset_text(timedelta(seconds=0.412), "release") == "0.412 s after release"
    assert offset_text(timedelta(seconds=-1.171), "release") == "1.171 s before release"


def test_a_throttled_fire_offered_again_for_a_running_slot_reads_as_the_tenants_quota_not_catch_up():
    # The audit's row: first published at +0.010 s, parked for max_running, offered again at +0.948 s, then ran.
    row = occurrence(
        throttled=True,
        attempt_count=1,
        enqueued_at=FIRE + timedelta(seconds=0.010),
        available_at=FIRE + timedelta(seconds=0.948),
        finished_at=FIRE + timedelta(seconds=1.5),
    )
    events = occurrence_timeline(row, [attempt(1, 1.0, 1.5)], definition=None, now=NOW)
    text = " ".join(f"{e.label}: {e.detail}" for e in events)

    assert "catch-up" not in text
    assert not re.search(r"(^|\s)[-\u2212]\d", text), text
    published = event(events, "Published")
    assert published.detail.startswith("First published 0.010 s after its fire time")
    again = event(events, "Offered again")
    assert again.at == row.available_at
    assert "0.948 s after its fire time" in again.detail and "max_running" in again.detail
    throttled = event(events, "Throttled")
    assert "max_fires_per_second" in throttled.detail
    assert throttled.at == row.available_at and events.index(throttled) > events.index(again), "with the later offer"


def test_a_throttled_fire_published_late_puts_the_wait_after_release_on_the_fire_rate():
    row = occurrence(throttled=True, attempt_count=1, enqueued_at=FIRE + timedelta(seconds=4.2))
    events = occurrence_timeline(row, [attempt(1, 4.3, 4.4)], definition=None, now=NOW)

    published = event(events, "Published").detail
    assert published.startswith("4.200 s after its fire time")
    assert "max_fires_per_second" in published
    assert not any(e.label == "Released" for e in events), "its release instant is its fire time"


def test_a_retry_says_its_release_moved_for_the_backoff():
    row = occurrence(
        attempt_count=2,
        enqueued_at=FIRE + timedelta(seconds=0.02),
        available_at=FIRE + timedelta(seconds=30),
        finished_at=FIRE + timedelta(seconds=31),
    )
    events = occurrence_timeline(row, [attempt(1, 0.1, 0.5, "failed"), attempt(2, 30.1, 31)], definition=None, now=NOW)

    retry = event(events, "Retry due")
    assert retry.detail.startswith("30.000 s after its fire time: attempt 1 failed")
    assert event(events, "Published").detail.startswith("First published 0.020 s after its fire time")


def test_only_a_fire_materialized_after_its_time_is_put_down_to_catch_up_pacing():
    paced = occurrence(
        created_at=FIRE + timedelta(minutes=3),
        available_at=FIRE + timedelta(minutes=3, seconds=2),
        enqueued_at=FIRE + timedelta(minutes=3, seconds=2.01),
    )
    events = occurrence_timeline(paced, [], definition=None, now=NOW)
    assert "catch-up budget" in event(events, "Released").detail
    assert event(events, "Published").detail == "0.010 s after release, 182.010 s after its fire time."

    flexible = occurrence(lane="flexible", available_at=FIRE + timedelta(seconds=40))
    assert (
        "flexible lane's spread window"
        in event(occurrence_timeline(flexible, [], definition=None, now=NOW), "Released").detail
    )


def test_a_claim_a_moment_before_the_fire_time_is_not_a_negative_lateness():
    row = occurrence(attempt_count=1, enqueued_at=FIRE)
    events = occurrence_timeline(row, [attempt(1, -0.002, 0.5)], definition=None, now=NOW)

    assert event(events, "Attempt 1 started").detail == "Claimed by worker-1, 0.002 s before its fire time."
