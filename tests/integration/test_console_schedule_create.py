"""Schedules created in the console for a tenant the operator acts on (through create_schedule, so the quota, the
calendars and version 1 apply), labels edited and shown, and the schedule list found by label selector, time zone
and tenant order."""

from __future__ import annotations

import re
import uuid

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.messages import get_messages
from django.test import Client
from django.utils.html import escape

from schedules.models import Schedule, ScheduleVersion
from tenants.access import OPERATOR_GROUP, READ_ONLY_GROUP
from tenants.models import OperatorAccess, Tenant
from tests.conftest import schedule_for
from tests.integration.support import form_data

SCHEDULES = "/admin/schedules/schedule/"
ADD = f"{SCHEDULES}add/"


def member(username: str, group: str, tenants: list[Tenant]) -> Client:
    """A console user of `group` acting on `tenants` only (tenants/access.py)."""
    user = get_user_model().objects.create_user(username, password="a long operator password", is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    if tenants:
        OperatorAccess.objects.create(user=user).tenants.set(tenants)
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    return client


def add_data(tenant: Tenant, **overrides: object) -> dict:
    """The add form as the console renders it, filled in for a daily 02:30 New York schedule, saved with Save."""
    data = {
        "tenant": tenant.pk,
        "request_key": str(uuid.uuid4()),
        "name": "console-made",
        "labels": "",
        "kind": "cron",
        "cron": "30 2 * * *",
        **{f"{field}_{part}": "" for field in ("run_at", "anchor_at", "start_at", "end_at") for part in (0, 1)},
        "every_seconds": "",
        "timezone": "America/New_York",
        "dst_gap": "",
        "dst_repeat": "",
        "max_runs": "",
        "exclude_calendars": "",
        "handler": "noop",
        "payload": "{}",
        "lane": "strict",
        "flexible_window_seconds": 300,
        "priority": 0,
        "misfire_policy": "skip",
        "max_lateness_seconds": 60,
        "catchup_limit": 10,
        "overlap_policy": "allow",
        "max_attempts": 5,
        "_save": "Save",
    }
    data.update(overrides)
    return data


def html(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def texts(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def listed_names(response) -> list[str]:
    """The schedule names of the list's rows, in their order."""
    return re.findall(r'<th class="field-name"><a href="[^"]+">([^<]+)</a></th>', html(response))


# --- creating ------------------------------------------------------------------------------------------------------


def test_an_operator_creates_a_schedule_for_a_tenant_it_acts_on(tenant_a, tenant_b):
    console = member("ana", OPERATOR_GROUP, [tenant_a.tenant])

    page = html(console.get(ADD))
    tenant_select = re.search(r'<select name="tenant".*?</select>', page, re.S).group(0)
    assert f'value="{tenant_a.tenant.pk}"' in tenant_select and f'value="{tenant_b.tenant.pk}"' not in tenant_select
    # The change form's live preview, for the tenant the form will name (preview.js adds it).
    assert 'id="live-preview"' in page and f'data-preview-url="{SCHEDULES}preview/"' in page
    assert re.search(r'<script src="/static/schedules/js/preview\.js"', page)

    response = console.post(ADD, add_data(tenant_a.tenant, labels="team=payments\nenv=prod"), follow=True)

    schedule = Schedule.objects.get(name="console-made")
    assert response.redirect_chain[-1][0] == f"{SCHEDULES}{schedule.pk}/change/"
    assert texts(response) == [
        f"console-made created for tenant {tenant_a.tenant.slug} as version 1 by the schedule service."
    ]
    assert (schedule.tenant_id, schedule.cron, schedule.timezone) == (
        tenant_a.tenant.pk,
        "30 2 * * *",
        "America/New_York",
    )
    assert schedule.labels == {"env": "prod", "team": "payments"}
    assert schedule.created_by == "operator:ana" and schedule.cursor.next_run_at is not None
    version = ScheduleVersion.objects.get(schedule=schedule)
    assert (version.version, version.change, version.actor) == (1, "create", "operator:ana")
    assert LogEntry.objects.filter(object_id=str(schedule.pk), action_flag=ADDITION).count() == 1


def test_the_add_button_is_offered_to_operators_who_may_change_schedules(console, tenants):
    assert f'href="{ADD}"' in html(console.get(SCHEDULES))
    page = html(console.get(ADD))
    assert 'name="tenant"' in page and 'name="labels"' in page and 'name="seen_version"' not in page


def test_the_add_page_starts_from_the_api_defaults_and_takes_the_tenant_from_the_query(console, tenant_a):
    page = html(console.get(ADD, {"tenant": tenant_a.tenant.pk}))

    assert f'<option value="{tenant_a.tenant.pk}" selected>' in page
    assert '<option value="cron" selected>' in page and '<option value="UTC" selected>' in page
    assert re.search(r'<textarea name="payload"[^>]*>\s*\{\}</textarea>', page)


def test_a_tenant_out_of_scope_is_refused_by_the_form_and_nothing_is_created(tenant_a, tenant_b):
    console = member("ana", OPERATOR_GROUP, [tenant_a.tenant])

    page = html(console.post(ADD, add_data(tenant_b.tenant)))

    assert "Select a valid choice" in page
    assert not Schedule.objects.filter(name="console-made").exists()


@pytest.mark.parametrize("group", [READ_ONLY_GROUP, OPERATOR_GROUP])
def test_who_may_not_change_a_tenants_schedules_cannot_add_one(tenant_a, group):
    # A read-only operator of acme, or an operator with no tenant at all.
    console = member("rita", group, [tenant_a.tenant] if group == READ_ONLY_GROUP else [])

    assert f'href="{ADD}"' not in html(console.get(SCHEDULES))
    assert console.get(ADD).status_code == 403
    assert console.post(ADD, add_data(tenant_a.tenant)).status_code == 403
    assert not Schedule.objects.filter(name="console-made").exists()


def test_a_full_quota_is_a_form_error_not_a_500(console, tenant_a):
    tenant = tenant_a.tenant
    schedule_for(tenant, name="holds-the-slot")
    Tenant.objects.filter(pk=tenant.pk).update(max_schedules=1)

    page = html(console.post(ADD, add_data(tenant)))

    assert f"Tenant {tenant.slug} holds 1 schedules, its quota is 1." in page
    assert not Schedule.objects.filter(name="console-made").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cron": "61 * * * *"}, "out of range for the minute field"),
        ({"exclude_calendars": "no-such-calendar"}, "no-such-calendar"),
        ({"labels": "Team=payments"}, "Label key 'Team'"),
        ({"labels": "team"}, "is not key=value"),
        ({"handler": ""}, "This field is required."),
    ],
)
def test_a_refused_definition_is_a_form_error_and_creates_nothing(console, tenant_a, overrides, message):
    page = html(console.post(ADD, add_data(tenant_a.tenant, **overrides)))

    assert escape(message) in page
    assert "errorlist" in page
    assert not Schedule.objects.filter(name="console-made").exists()


def test_submitting_the_add_page_twice_meets_the_schedule_it_created(console, tenant_a):
    data = add_data(tenant_a.tenant)

    first = console.post(ADD, data, follow=True)
    second = console.post(ADD, data, follow=True)

    schedule = Schedule.objects.get(name="console-made")
    assert first.redirect_chain[-1][0] == second.redirect_chain[-1][0] == f"{SCHEDULES}{schedule.pk}/change/"
    assert texts(second) == ["console-made was already created from this page: nothing new was created."]
    assert LogEntry.objects.filter(object_id=str(schedule.pk), action_flag=ADDITION).count() == 1
    changed = console.post(ADD, {**data, "cron": "0 9 * * *"})
    assert "already created a schedule with other values" in html(changed)
    assert Schedule.objects.filter(name="console-made").count() == 1


# --- labels -------------------------------------------------------------------------------------------------------


def test_labels_edited_in_the_change_form_are_a_new_version_and_show_as_chips_on_the_list(console, tenant_a):
    schedule = schedule_for(tenant_a.tenant, name="payroll", labels={"team": "ops"})
    url = f"{SCHEDULES}{schedule.pk}/change/"
    assert "team=ops" in html(console.get(url))  # the textarea shows key=value lines

    response = console.post(url, form_data(schedule, labels="team=payments\r\nenv = prod\n\n"))

    assert response.status_code == 302, response.content.decode()[:2000]
    schedule.refresh_from_db()
    assert (schedule.labels, schedule.version) == ({"env": "prod", "team": "payments"}, 2)
    version = ScheduleVersion.objects.get(schedule=schedule, version=2)
    assert version.actor == "operator:ops" and version.definition["labels"] == {"env": "prod", "team": "payments"}
    listing = html(console.get(SCHEDULES))
    assert '<a class="label-chip" href="/admin/schedules/schedule/?selector=team%3Dpayments"' in listing
    assert ">env=prod</a>" in listing


def test_a_read_only_page_shows_the_labels_as_chips(tenant_a):
    schedule = schedule_for(tenant_a.tenant, name="payroll", labels={"team": "ops", "note": "a,b"})
    console = member("rita", READ_ONLY_GROUP, [tenant_a.tenant])

    page = html(console.get(f"{SCHEDULES}{schedule.pk}/change/"))

    assert 'name="labels"' not in page
    assert '<a class="label-chip" href="/admin/schedules/schedule/?selector=team%3Dops"' in page
    assert '<span class="label-chip" title="note=a,b">note=a,b</span>' in page  # no selector can pick a ','


def test_an_edit_without_a_labels_change_keeps_them_and_bad_labels_save_nothing(console, tenant_a):
    schedule = schedule_for(tenant_a.tenant, name="payroll", labels={"team": "ops"})
    url = f"{SCHEDULES}{schedule.pk}/change/"

    kept = console.post(url, form_data(schedule, labels="team=ops", cron="0 9 * * *"))
    schedule.refresh_from_db()
    assert kept.status_code == 302 and (schedule.labels, schedule.version) == ({"team": "ops"}, 2)

    too_many = "\n".join(f"k{index}=v" for index in range(21))
    for labels, message in ((too_many, "At most 20 labels"), ("team=a\nteam=b", "given twice")):
        page = html(console.post(url, form_data(schedule, labels=labels)))
        assert message in page
    schedule.refresh_from_db()
    assert (schedule.labels, schedule.version) == ({"team": "ops"}, 2)


# --- finding schedules --------------------------------------------------------------------------------------------


@pytest.fixture
def fleet(tenant_a, tenant_b):
    """Labelled schedules in both tenants, created so that newest-first would interleave the tenants."""
    return {
        "pay-prod": schedule_for(tenant_a.tenant, name="pay-prod", labels={"team": "payments", "env": "prod"}),
        "zeta-globex": schedule_for(tenant_b.tenant, name="zeta-globex", timezone="Europe/Madrid"),
        "pay-dev": schedule_for(tenant_a.tenant, name="pay-dev", labels={"team": "payments", "env": "dev"}),
        "alpha-globex": schedule_for(tenant_b.tenant, name="alpha-globex", labels={"team": "payments"}),
        "search": schedule_for(tenant_a.tenant, name="search", labels={"team": "search"}, timezone="Europe/Berlin"),
    }


def test_the_list_is_ordered_by_tenant_then_name(console, fleet, tenant_a, tenant_b):
    acme, globex = sorted([tenant_a.tenant, tenant_b.tenant], key=lambda tenant: tenant.pk)

    names = listed_names(console.get(SCHEDULES))

    by_tenant = {s.name: s.tenant_id for s in fleet.values()}
    assert names == sorted(fleet, key=lambda name: (by_tenant[name], name))
    assert [by_tenant[name] for name in names] == sorted(by_tenant[name] for name in names)
    assert {acme.pk, globex.pk} == set(by_tenant.values())


@pytest.mark.parametrize("column", ["tenant_slug", "name", "state_text", "next_fire"])
def test_the_main_columns_sort(console, fleet, column):
    page = html(console.get(SCHEDULES))
    header = re.search(rf'<th scope="col" class="([^"]*)column-{column}', page)
    assert header and "sortable" in header.group(1), column
    index = re.findall(r'<th scope="col" class="[^"]*column-([a-z_]+)', page).index(column) + 1  # after the checkbox

    descending = listed_names(console.get(SCHEDULES, {"o": f"-{index}"}))

    assert sorted(descending) == sorted(fleet)
    if column == "name":
        assert descending == sorted(fleet, reverse=True)


def test_the_search_finds_schedules_by_time_zone(console, fleet):
    europe = listed_names(console.get(SCHEDULES, {"q": "Europe/"}))
    madrid = listed_names(console.get(SCHEDULES, {"q": "europe/madrid"}))

    assert sorted(europe) == ["search", "zeta-globex"]
    assert madrid == ["zeta-globex"]


@pytest.mark.parametrize(
    ("selector", "found"),
    [
        ("team=payments", ["pay-dev", "pay-prod", "alpha-globex"]),
        ("team=payments,env!=dev", ["pay-prod", "alpha-globex"]),
        ("env!=dev", ["pay-prod", "search", "alpha-globex", "zeta-globex"]),
        (" ", ["pay-dev", "pay-prod", "search", "alpha-globex", "zeta-globex"]),
    ],
)
def test_the_label_selector_filters_the_list(console, fleet, selector, found):
    response = console.get(SCHEDULES, {"selector": selector})

    by_tenant = {s.name: s.tenant_id for s in fleet.values()}
    assert listed_names(response) == sorted(found, key=lambda name: (by_tenant[name], name))
    assert f'name="selector" value="{selector}"' in html(response)


def test_the_label_selector_keeps_the_other_filters_and_combines_with_them(console, fleet, tenant_b):
    response = console.get(SCHEDULES, {"selector": "team=payments", "tenant__id__exact": tenant_b.tenant.pk})

    assert listed_names(response) == ["alpha-globex"]
    assert f'<input type="hidden" name="tenant__id__exact" value="{tenant_b.tenant.pk}">' in html(response)


@pytest.mark.parametrize(
    ("selector", "message"),
    [("team", "is not a requirement"), ("team=a,team=b", "required to equal two values"), ("Team=x", "a key is")],
)
def test_a_malformed_selector_says_why_and_lists_nothing(console, fleet, selector, message):
    response = console.get(SCHEDULES, {"selector": selector})

    page = html(response)
    assert listed_names(response) == []
    [shown] = texts(response)
    assert shown.startswith("Label selector not applied, no schedule listed:") and message in shown
    assert 'id="label-selector-error"' in page and message in page


def test_a_bulk_action_over_a_malformed_selector_reaches_no_schedule(console, fleet):
    response = console.post(
        f"{SCHEDULES}?selector=team",
        {"action": "pause_schedules", "select_across": "1", "_selected_action": str(fleet["pay-prod"].pk)},
    )

    assert response.status_code in (200, 302)
    assert not Schedule.objects.filter(state="paused").exists()
    assert sum("Label selector not applied" in text for text in texts(response)) == 1
