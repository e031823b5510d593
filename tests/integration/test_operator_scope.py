"""Console operators scoped to tenants (tenants/access.py): an operator or read-only operator of tenant A sees and
acts on A's rows only, on every list, filter, page, action and dashboard figure; the two groups carry exactly
their permissions; an operator without assigned tenants sees none."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.test import Client

from core.clock import db_now
from dispatch.models import OccurrenceState
from schedules.models import Schedule
from tenants.access import OPERATOR_GROUP, OPERATOR_PERMISSIONS, READ_ONLY_GROUP, READ_ONLY_PERMISSIONS
from tenants.models import OperatorAccess
from tests.conftest import occurrence_for, schedule_for

SCHEDULES = "/admin/schedules/schedule/"
OCCURRENCES = "/admin/dispatch/occurrence/"
PASSWORD = "a long operator password"


def member(username: str, group: str | None, tenants: list, *, all_tenants: bool = False) -> Client:
    user = get_user_model().objects.create_user(username, password=PASSWORD, is_staff=True)
    if group:
        user.groups.add(Group.objects.get(name=group))
    if tenants or all_tenants:
        access = OperatorAccess.objects.create(user=user, all_tenants=all_tenants)
        access.tenants.set(tenants)
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    return client


@pytest.fixture
def rows(tenant_a, tenant_b):
    """A schedule in each tenant, each with a dead occurrence."""
    own = schedule_for(tenant_a.tenant, name="own-report")
    other = schedule_for(tenant_b.tenant, name="other-report")
    at = db_now().replace(second=0, microsecond=0) - timedelta(minutes=10)
    dead = {s.tenant_id: occurrence_for(s, at=at, state=OccurrenceState.DEAD) for s in (own, other)}
    return own, other, dead


def html(response) -> str:
    return response.content.decode()


def test_the_two_groups_hold_exactly_their_permissions(db):
    for name, wanted in ((READ_ONLY_GROUP, READ_ONLY_PERMISSIONS), (OPERATOR_GROUP, OPERATOR_PERMISSIONS)):
        held = set(Group.objects.get(name=name).permissions.values_list("content_type__app_label", "codename"))
        assert held == set(wanted)
    assert ("schedules", "change_schedule") not in READ_ONLY_PERMISSIONS


def test_an_operator_of_one_tenant_sees_only_its_rows_everywhere(tenant_a, tenant_b, rows):
    own, other, dead = rows
    console = member("ana", OPERATOR_GROUP, [tenant_a.tenant])

    schedules = html(console.get(SCHEDULES))
    assert "own-report" in schedules and "other-report" not in schedules
    assert f"?tenant__id__exact={tenant_b.tenant.pk}" not in schedules  # the tenant filter lists A only
    assert console.get(f"{SCHEDULES}{other.pk}/change/").status_code == 302  # "does not exist", back to the list
    occurrences = html(console.get(f"{OCCURRENCES}?state__exact=dead"))
    assert str(dead[own.tenant_id].pk) in occurrences and str(dead[other.tenant_id].pk) not in occurrences
    assert console.get(f"{OCCURRENCES}{dead[other.tenant_id].pk}/change/").status_code == 302
    tenants = html(console.get("/admin/tenants/tenant/"))
    assert tenant_a.tenant.slug in tenants and f"/admin/tenants/tenant/{tenant_b.tenant.pk}/change/" not in tenants
    assert console.get("/admin/dispatch/outboxmessage/").status_code == 403
    other_name = html(console.get(f"{OCCURRENCES}?schedule={other.pk}"))
    assert "other-report" not in other_name


def test_an_operator_acts_on_its_tenants_schedules_and_on_no_other(tenant_a, rows):
    own, other, _ = rows
    console = member("ana", OPERATOR_GROUP, [tenant_a.tenant])

    console.post(f"{SCHEDULES}{own.pk}/operate/pause/", {"note": "mine"})
    console.post(f"{SCHEDULES}{other.pk}/operate/pause/", {"note": "not mine"})
    console.post(
        SCHEDULES,
        {"action": "cancel_schedules", ACTION_CHECKBOX_NAME: [str(own.pk), str(other.pk)], "select_across": "1"},
    )

    assert Schedule.objects.get(pk=own.pk).state in ("paused", "canceled")
    assert Schedule.objects.get(pk=other.pk).state == "active"


def test_a_read_only_operator_sees_but_cannot_act(tenant_a, rows):
    own, _, dead = rows
    console = member("rita", READ_ONLY_GROUP, [tenant_a.tenant])

    assert "own-report" in html(console.get(SCHEDULES))
    assert console.post(f"{SCHEDULES}{own.pk}/operate/pause/", {"note": "x"}).status_code == 403
    assert console.post(f"{OCCURRENCES}{dead[own.tenant_id].pk}/replay/").status_code == 403
    assert Schedule.objects.get(pk=own.pk).state == "active"
    assert 'name="seen_version"' not in html(console.get(f"{SCHEDULES}{own.pk}/change/"))


def test_an_operator_without_assigned_tenants_sees_no_tenants_rows(rows):
    console = member("nobody", OPERATOR_GROUP, [])

    page = html(console.get(SCHEDULES))
    assert "own-report" not in page and "other-report" not in page
    assert html(console.get(f"{OCCURRENCES}?state__exact=dead")).count("/admin/dispatch/occurrence/") <= 2


def test_an_operator_of_every_tenant_sees_them_all(rows):
    console = member("platform", OPERATOR_GROUP, [], all_tenants=True)

    page = html(console.get(SCHEDULES))
    assert "own-report" in page and "other-report" in page


def test_the_dashboard_counts_only_the_operators_tenants(tenant_a, rows):
    console = member("ana", READ_ONLY_GROUP, [tenant_a.tenant])
    platform = member("platform", READ_ONLY_GROUP, [], all_tenants=True)

    scoped_page, whole = html(console.get("/admin/")), html(platform.get("/admin/"))

    dead_tile = '<span class="figure">{}</span><span class="label">in the DLQ (dead)</span>'
    assert dead_tile.format(1) in scoped_page and dead_tile.format(2) in whole
    assert "fires due, not yet sent" not in scoped_page and "fires due, not yet sent" in whole
    assert "Fires due in the next 60 minutes" not in scoped_page
    assert "<h2>Processes" not in scoped_page and "<h2>Processes" in whole
    assert ">Metrics</a>" not in scoped_page  # /metrics names every tenant


def test_the_preview_refuses_another_tenants_calendars(tenant_a, tenant_b, rows):
    console = member("ana", OPERATOR_GROUP, [tenant_a.tenant])
    body = '{"kind": "cron", "cron": "0 9 * * *", "timezone": "UTC"}'

    own = console.post(f"{SCHEDULES}preview/?tenant={tenant_a.tenant.pk}", body, content_type="application/json")
    other = console.post(f"{SCHEDULES}preview/?tenant={tenant_b.tenant.pk}", body, content_type="application/json")

    assert own.status_code == 200 and other.status_code == 400


def test_ensure_operator_makes_a_scoped_operator_and_refuses_unknown_tenants(tenant_a):
    call_command(
        "ensure_operator", "--username", "olga", "--password", PASSWORD, "--role", "read-only",
        "--tenants", tenant_a.tenant.slug, stdout=StringIO(),
    )  # fmt: skip

    user = get_user_model().objects.get(username="olga")
    assert not user.is_superuser and list(user.groups.values_list("name", flat=True)) == [READ_ONLY_GROUP]
    assert list(user.operator_access.tenants.all()) == [tenant_a.tenant]
    with pytest.raises(CommandError, match="Unknown tenant"):
        call_command(
            "ensure_operator", "--username", "olga", "--password", PASSWORD, "--role", "operator",
            "--tenants", "no-such-tenant", stdout=StringIO(),
        )  # fmt: skip
    call_command("ensure_operator", "--username", "olga", "--password", PASSWORD, stdout=StringIO())
    user.refresh_from_db()
    assert user.is_superuser and not user.groups.exists() and not OperatorAccess.objects.filter(user=user).exists()
