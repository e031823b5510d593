"""Shared fixtures: two tenant personas (acme and globex) with API clients bound to their own hosts, and factories
for the rows tests build below the API (schedules through the services, occurrences written directly)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from django.conf import settings
from django.db import InterfaceError, InternalError, connection
from pytest_django.plugin import blocking_manager_key
from rest_framework.test import APIClient

from core.choices import ScheduleState
from dispatch.identity import occurrence_id_for
from dispatch.models import Occurrence, OccurrenceState
from schedules.models import Schedule, ScheduleCursor
from schedules.services import create_schedule
from tenants.models import Domain, Tenant
from tenants.services import Provisioned, provision_tenant

TENANT_A = ("acme", "acme.localhost")
TENANT_B = ("globex", "globex.localhost")
# The fixtures that make pytest-django set up the test database (as a django_db mark does).
DATABASE_FIXTURES = {"db", "transactional_db", "live_server"}


# The personas as this process last provisioned them: what `platform_rows` reads back.
_PROVISIONED: dict[str, Provisioned] = {}


def ensure_platform_rows() -> dict[str, Provisioned]:
    """The public tenant with its hosts, and the two personas, provisioned (a few dozen queries even when present).

    Transactional tests (real processes need committed rows) end with a TRUNCATE of the public tables, which
    also removes these rows; the tenant schemas, users and tokens survive it, so re-provisioning is fast and
    returns the same tokens.
    """
    public, _ = Tenant.objects.get_or_create(
        schema_name="public", defaults={"slug": "public", "name": "Platform operators"}
    )
    for index, host in enumerate(settings.SCHEDULER_PUBLIC_HOSTS):
        Domain.objects.get_or_create(domain=host, defaults={"tenant": public, "is_primary": index == 0})
    provisioned = {
        slug: provision_tenant(slug, domain=domain, name=slug.title()) for slug, domain in (TENANT_A, TENANT_B)
    }
    connection.set_schema_to_public()
    _PROVISIONED.clear()
    _PROVISIONED.update(provisioned)
    return provisioned


def platform_rows() -> dict[str, Provisioned]:
    """The personas in one query: the rows ensure_platform_rows left are still there (a test that changed them was
    rolled back, and a transactional one is followed by ensure_platform_rows), so only the Tenant rows are read again,
    fresh for the test to change. Provisioning them again before each of ~900 tests cost a tenth of a second each."""
    if _PROVISIONED:
        rows = {tenant.slug: tenant for tenant in Tenant.objects.filter(slug__in=list(_PROVISIONED))}
        if all(slug in rows and rows[slug].pk == known.tenant.pk for slug, known in _PROVISIONED.items()):
            return {slug: replace(known, tenant=rows[slug]) for slug, known in _PROVISIONED.items()}
    return ensure_platform_rows()


def _uses_the_database(item: pytest.Item) -> bool:
    """Whether pytest-django sets up the test database for this test: a django_db mark or a database fixture."""
    fixtures = set(getattr(item, "fixturenames", ()))
    return item.get_closest_marker("django_db") is not None or bool(fixtures & DATABASE_FIXTURES)


@pytest.fixture(scope="session", autouse=True)
def _tenant_schemas(request, django_db_blocker) -> None:
    """Create the personas' schemas once per test database: schema creation is the slow part.

    A session without any database test (`make test-fast`, `pytest tests/unit`) sets up no test database and
    touches no server: it runs where PostgreSQL is not running at all.
    """
    if not any(_uses_the_database(item) for item in request.session.items):
        return
    request.getfixturevalue("django_db_setup")
    with django_db_blocker.unblock():
        ensure_platform_rows()


def _flushes_the_database(item: pytest.Item) -> bool:
    """Whether pytest-django empties every table after this test (a transactional test: real processes need
    committed rows) instead of rolling its transaction back."""
    marker = item.get_closest_marker("django_db")
    fixtures = set(getattr(item, "fixturenames", ()))
    return bool(marker and marker.kwargs.get("transaction")) or bool(fixtures & {"transactional_db", "live_server"})


# The occurrences in a watched state that the watch table does not hold as they are, and the watch rows that hold
# no such occurrence: both empty whenever a statement has committed (migration 0017 keeps the watch by triggers).
WATCH_DISAGREEMENTS = """
SELECT count(*) FROM (
    (SELECT occurrence_id, scheduled_for, schedule_id, tenant_id, state, attempt_count, lease_expires_at
     FROM public.dispatch_occurrence WHERE state IN ('running', 'retry_wait', 'dead')
     EXCEPT
     SELECT occurrence_id, scheduled_for, schedule_id, tenant_id, state, attempt_count, lease_expires_at
     FROM public.dispatch_occurrence_watch)
    UNION ALL
    (SELECT occurrence_id, scheduled_for, schedule_id, tenant_id, state, attempt_count, lease_expires_at
     FROM public.dispatch_occurrence_watch
     EXCEPT
     SELECT occurrence_id, scheduled_for, schedule_id, tenant_id, state, attempt_count, lease_expires_at
     FROM public.dispatch_occurrence WHERE state IN ('running', 'retry_wait', 'dead'))
) AS disagreements
"""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """After every database test that passed, the watch table agrees with the occurrence table: whatever path the
    test took to change occurrences, the triggers followed it (one snapshot, so processes still running do not
    matter). A failed test's own error is what it reports."""
    result = yield
    if not _uses_the_database(item):
        return result
    with item.config.stash[blocking_manager_key].unblock():
        try:
            with connection.cursor() as cursor:
                cursor.execute(WATCH_DISAGREEMENTS)
                disagreements = cursor.fetchone()[0]
        except (InternalError, InterfaceError):  # the test left its connection aborted or closed on purpose
            return result
    assert disagreements == 0, f"{disagreements} occurrence rows and watch rows disagree"
    return result


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a transactional test's flush, the platform rows again: the console's public host and the personas are
    what every later test of this process may take for granted, whatever order the tests run in."""
    yield
    if nextitem is not None and _flushes_the_database(item):  # after the last test, the database is gone
        with item.config.stash[blocking_manager_key].unblock():
            ensure_platform_rows()


@pytest.fixture
def tenants(db) -> dict[str, Provisioned]:
    return platform_rows()


@pytest.fixture
def tenant_a(tenants) -> Provisioned:
    return tenants[TENANT_A[0]]


@pytest.fixture
def tenant_b(tenants) -> Provisioned:
    return tenants[TENANT_B[0]]


@pytest.fixture
def tenant(tenant_a) -> Tenant:
    """The acme persona's Tenant row, for tests that call the services below the API."""
    return tenant_a.tenant


def api_client_for(provisioned: Provisioned, token: str | None = None) -> APIClient:
    client = APIClient(HTTP_HOST=provisioned.domain)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token or provisioned.token}")
    return client


@pytest.fixture
def api_a(tenant_a) -> APIClient:
    return api_client_for(tenant_a)


@pytest.fixture
def api_b(tenant_b) -> APIClient:
    return api_client_for(tenant_b)


@pytest.fixture(autouse=True)
def _public_schema_after_each_test():
    """A request leaves the connection on its tenant's schema; later ORM use must start from public."""
    yield
    connection.set_schema_to_public()


@pytest.fixture
def cron_body() -> dict:
    return {
        "name": "nightly-report",
        "kind": "cron",
        "cron": "30 2 * * *",
        "timezone": "America/New_York",
        "handler": "noop",
    }


# --- factories ------------------------------------------------------------------------------------------------


def schedule_for(tenant: Tenant, *, now: datetime | None = None, actor: str = "test", **fields: Any) -> Schedule:
    """A schedule of `tenant` created through schedules.services.create_schedule (every check, the version row and
    the first cursor, as the API would), at `now` (the database clock when None) by `actor`.

    Defaults: a cron schedule named "job" firing every minute with the "noop" handler; `fields` override them. A
    schedule of kind "once" gets no default cron (give it `run_at`).
    """
    data = {"name": "job", "kind": "cron", "handler": "noop", **fields}
    if data["kind"] == "cron":
        data.setdefault("cron", "* * * * *")
    schedule, _ = create_schedule(tenant=tenant, data=data, actor=actor, now=now)
    return schedule


def occurrence_for(
    schedule: Schedule,
    *,
    at: datetime,
    version: int | None = None,
    state: str = OccurrenceState.SCHEDULED,
    **fields: Any,
) -> Occurrence:
    """An occurrence of `schedule` due at `at`, with its deterministic id, written directly (no materializer).

    It takes the schedule's tenant, current version, lane and priority and is available at `at`; `version`,
    `state` and any other column given in `fields` (available_at, lane, enqueued_at, ...) override those.
    """
    version = schedule.version if version is None else version
    row = {
        "occurrence_id": occurrence_id_for(schedule.id, version, at),
        "schedule": schedule,
        "tenant_id": schedule.tenant_id,
        "schedule_version": version,
        "scheduled_for": at,
        "available_at": at,
        "lane": schedule.lane,
        "priority": schedule.priority,
        "state": state,
    }
    return Occurrence.objects.create(**{**row, **fields})


def move_cursor(schedule_ids: Any, at: datetime | None) -> None:
    """Put the cursor of an active schedule (an id, or a list of ids) at `at`, as the materializer moves it (None: a
    one-off whose only fire was materialized)."""
    ids = schedule_ids if isinstance(schedule_ids, list) else [schedule_ids]
    ScheduleCursor.objects.filter(schedule_id__in=ids).update(next_run_at=at)


def mark_completed(schedule_id: Any) -> None:
    """Complete a schedule behind the services' back, as the materializer's maintenance pass completes a one-off."""
    Schedule.objects.filter(pk=schedule_id).update(state=ScheduleState.COMPLETED)
    ScheduleCursor.objects.filter(schedule_id=schedule_id).delete()


@pytest.fixture
def make_schedule() -> Callable[..., Schedule]:
    """Factory: `make_schedule(tenant, now=None, actor="test", **fields)`; see `schedule_for` for the defaults."""
    return schedule_for


@pytest.fixture
def make_occurrence() -> Callable[..., Occurrence]:
    """Factory: `make_occurrence(schedule, at=..., version=None, state="scheduled", **fields)`; see
    `occurrence_for`."""
    return occurrence_for


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first (their order otherwise kept): under pytest-xdist a minute-long process test that starts
    last is the whole run's tail, while the many quick ones fill the gaps around the slow ones."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
