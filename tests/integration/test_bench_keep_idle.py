"""`bench burst --keep-idle`: the stored idle schedules survive a run's cleanup and the next run reuses them, so
consecutive runs over 20 M stored schedules do not reload them each time."""

from __future__ import annotations

from io import StringIO

import pytest

from core.clock import db_now
from dispatch.bench.burst import BurstBenchmark, BurstConfig
from schedules.models import Schedule, ScheduleCursor, ScheduleVersion
from tenants.models import Tenant

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def bench(idle: int, *, keep_idle: bool = True) -> BurstBenchmark:
    return BurstBenchmark(BurstConfig(schedules=5, tenants=2, idle=idle, keep_idle=keep_idle), out=StringIO())


def stored(name_prefix: str) -> tuple[int, int, int]:
    """Schedules, cursors and versions of the bench schedules whose names start with the prefix."""
    ids = Schedule.objects.filter(name__startswith=name_prefix).values("id")
    return (
        Schedule.objects.filter(id__in=ids).count(),
        ScheduleCursor.objects.filter(schedule_id__in=ids).count(),
        ScheduleVersion.objects.filter(schedule_id__in=ids).count(),
    )


def test_idle_schedules_are_kept_reused_reloaded_when_the_count_changes_and_removed_without_the_flag():
    first = bench(40)
    first.cleanup()
    tenants = first.provision()
    assert isinstance(first.load_idle(tenants), float)
    first.copy_schedules(tenants, 5, db_now(), due=True)
    first.write_first_versions(due=True)
    first.cleanup()
    assert stored("bench-idle-") == (40, 40, 40)
    assert stored("bench-due-") == (0, 0, 0)
    assert Tenant.objects.filter(slug__startswith="bench-").count() == 2

    second = bench(40)
    assert second.load_idle(second.provision()) is None
    assert stored("bench-idle-") == (40, 40, 40)

    third = bench(25)
    assert isinstance(third.load_idle(third.provision()), float)
    assert stored("bench-idle-") == (25, 25, 25)

    bench(25, keep_idle=False).cleanup()
    assert stored("bench-") == (0, 0, 0)
    assert not Tenant.objects.filter(slug__startswith="bench-").exists()
