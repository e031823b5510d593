"""Configuration the data depends on lives in the database: a materializer that would orphan schedules refuses to
start, with a message that says what to set."""

from __future__ import annotations

import pytest
from django.conf import settings

from dispatch.models import ShardLease
from schedules.models import Schedule
from tests.integration.processes import process_env, run_manage
from tests.integration.support import materializer_holding_every_shard

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_materializer_with_fewer_shards_than_the_data_uses_refuses_to_start(tenant_a, make_schedule):
    materializer_holding_every_shard("configured").release_all()  # every shard's lease row exists
    schedule = make_schedule(tenant_a.tenant, name="high-shard")
    Schedule.objects.filter(pk=schedule.pk).update(shard=settings.SCHEDULER_SHARDS - 1)

    finished = run_manage("materialize", "--once", env=process_env(SCHEDULER_SHARDS="8"))

    assert finished.returncode == 1
    assert f"The database already uses {settings.SCHEDULER_SHARDS} shards" in finished.stderr
    assert f"Set SCHEDULER_SHARDS={settings.SCHEDULER_SHARDS}" in finished.stderr
    assert "Traceback" not in finished.stderr
    assert not ShardLease.objects.exclude(owner="").exists(), "it took no lease before refusing"


def test_a_materializer_with_the_same_shard_count_starts(tenant_a):
    materializer_holding_every_shard("configured").release_all()

    finished = run_manage("materialize", "--once")

    assert finished.returncode == 0, finished.stderr[-2000:]
