"""What a version owes under max_runs (dispatch/history.py): its first remaining_runs fires after valid_from, found
without walking the version's whole past (an interval by arithmetic, a cron rule no further than the window)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from dispatch.history import VersionSpan, expected_fires, expects

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def span(remaining: int | None, **rule) -> VersionSpan:
    fields = {"kind": "interval", "every_seconds": 1, "anchor_at": T0, "cron": None, "run_at": None, **rule}
    return VersionSpan(
        schedule_id=uuid.uuid4(),
        tenant_id=1,
        version=1,
        change="create",
        state="active",
        timezone="UTC",
        lane="strict",
        priority=0,
        valid_from=T0,
        valid_to=None,
        remaining_runs=remaining,
        **fields,
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def owed(version: VersionSpan, since: datetime, until: datetime) -> list[datetime]:
    return [fire.scheduled_for for fire in expected_fires(version, since, until)]


def test_a_limited_interval_owes_its_first_runs_and_none_after() -> None:
    version = span(5)
    assert owed(version, T0, at(100)) == [at(s) for s in range(1, 6)]
    assert owed(version, at(3), at(100)) == [at(3), at(4), at(5)]
    assert (expects(version, at(5)), expects(version, at(6))) == (True, False)


def test_a_month_old_version_with_a_large_limit_is_answered_without_walking_its_past() -> None:
    # Ten million runs of a 1 s interval: the month's 2.6 million fires before the window are not walked.
    version = span(10_000_000)
    since = T0 + timedelta(days=30)
    assert owed(version, since, since + timedelta(seconds=3)) == [
        since,
        since + timedelta(seconds=1),
        since + timedelta(seconds=2),
    ]
    assert expects(version, since)


@pytest.mark.parametrize("remaining", [0, -2])
def test_no_run_left_owes_nothing(remaining: int) -> None:
    assert owed(span(remaining), T0, at(100)) == []
    assert not expects(span(remaining), at(1))


def test_a_limited_cron_version_owes_its_first_runs() -> None:
    version = span(3, kind="cron", cron="0 * * * *", every_seconds=None, anchor_at=None)
    hours = [T0 + timedelta(hours=h) for h in (1, 2, 3)]
    assert owed(version, T0, T0 + timedelta(days=1)) == hours
    assert (expects(version, hours[-1]), expects(version, T0 + timedelta(hours=4))) == (True, False)


def test_a_one_off_with_no_run_left_owes_nothing() -> None:
    version = span(0, kind="once", run_at=at(10), every_seconds=None, anchor_at=None)
    assert owed(version, T0, at(100)) == []
    assert not expects(version, at(10))
