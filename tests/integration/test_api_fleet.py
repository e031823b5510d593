"""Fleet operations of the tenant API (docs/API.md, "Fleet operations"): labels and selectors on the list, bulk
changes by selector or ids (each its own version, with a note and a dry run), export and apply (applying an export
changes nothing), a schedule's version history and backfill. Tenant B never sees or changes tenant A's schedules."""

from __future__ import annotations

from datetime import timedelta

from core.clock import db_now
from dispatch.models import Occurrence
from schedules.fleet import MAX_FLEET
from schedules.models import Schedule, ScheduleVersion
from tests.conftest import schedule_for

SCHEDULES = "/api/v1/schedules/"
BULK = f"{SCHEDULES}bulk/"
EXPORT = f"{SCHEDULES}export/"
APPLY = f"{SCHEDULES}apply/"


def create(api, name: str, labels: dict | None = None, **fields) -> dict:
    body = {"name": name, "kind": "cron", "cron": "*/5 * * * *", "handler": "noop", **fields}
    if labels is not None:
        body["labels"] = labels
    response = api.post(SCHEDULES, body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def names(response) -> list[str]:
    assert response.status_code == 200, response.content
    return sorted(s["name"] for s in response.json()["results"])


def fleet(api) -> dict[str, dict]:
    return {
        "pay-prod": create(api, "pay-prod", {"team": "payments", "env": "prod"}),
        "pay-dev": create(api, "pay-dev", {"team": "payments", "env": "dev"}),
        "pay-bare": create(api, "pay-bare", {"team": "payments"}),
        "search": create(api, "search", {"team": "search", "env": "prod"}),
    }


def test_labels_are_kept_shown_and_replaced_as_a_whole(api_a):
    shown = create(api_a, "labelled", {"team": "payments", "tier": "gold"})
    assert shown["labels"] == {"team": "payments", "tier": "gold"}
    changed = api_a.patch(f"{SCHEDULES}{shown['id']}/", {"labels": {"team": "search"}}, format="json")
    assert changed.status_code == 200 and changed.json()["labels"] == {"team": "search"}
    assert create(api_a, "plain")["labels"] == {}


def test_a_bad_label_set_is_a_400_naming_labels(api_a):
    base = {"name": "x", "kind": "cron", "cron": "* * * * *", "handler": "noop"}
    for labels in (
        {"Team": "x"},
        {"-team": "x"},
        {"team": 5},
        {"team": "x" * 64},
        {"team": "a\nb"},
        {f"k{i}": "v" for i in range(21)},
        ["team"],
    ):
        response = api_a.post(SCHEDULES, {**base, "labels": labels}, format="json")
        assert response.status_code == 400 and "labels" in response.json(), (labels, response.content)


def test_the_list_selects_by_label_with_equality_and_inequality(api_a, api_b):
    fleet(api_a)
    create(api_b, "b-pay", {"team": "payments"})

    assert names(api_a.get(SCHEDULES, {"selector": "team=payments"})) == ["pay-bare", "pay-dev", "pay-prod"]
    # A `!=` requirement also matches a schedule without the label (pay-bare).
    assert names(api_a.get(SCHEDULES, {"selector": "team=payments,env!=dev"})) == ["pay-bare", "pay-prod"]
    assert names(api_a.get(SCHEDULES, {"selector": "env=prod"})) == ["pay-prod", "search"]
    assert names(api_a.get(SCHEDULES, {"selector": "team=nobody"})) == []


def test_a_malformed_selector_is_a_400_naming_selector(api_a):
    for selector in ("team", "team!x", "=x", "Team=x", "team=a,team=b", "team=x,"):
        response = api_a.get(SCHEDULES, {"selector": selector})
        assert response.status_code == 400 and "selector" in response.json(), (selector, response.content)


def test_bulk_pause_by_selector_makes_one_version_each_with_the_note(api_a):
    made = fleet(api_a)
    body = {"action": "pause", "selector": "team=payments,env!=dev", "note": "vendor outage"}

    result = api_a.post(BULK, body, format="json").json()

    assert (result["matched"], result["changed"]) == (2, 2)
    assert {r["id"] for r in result["results"]} == {made["pay-prod"]["id"], made["pay-bare"]["id"]}
    assert all(r["state"] == "paused" and r["error"] is None for r in result["results"])
    latest = ScheduleVersion.objects.filter(schedule_id=made["pay-prod"]["id"]).order_by("-version").first()
    assert (latest.change, latest.note, latest.version) == ("pause", "vendor outage", 2)
    assert Schedule.objects.get(pk=made["pay-dev"]["id"]).state == "active"
    again = api_a.post(BULK, body, format="json").json()
    assert (again["matched"], again["changed"]) == (2, 0)  # already paused: left as it is, no new version


def test_a_dry_run_says_what_would_change_and_changes_nothing(api_a):
    made = fleet(api_a)
    api_a.post(f"{SCHEDULES}{made['pay-dev']['id']}/pause/", {}, format="json")
    api_a.post(f"{SCHEDULES}{made['search']['id']}/cancel/", {}, format="json")
    ids = [made[name]["id"] for name in ("pay-prod", "pay-dev", "search")]
    for action in ("pause", "resume", "cancel", "trigger"):
        versions = ScheduleVersion.objects.count()
        dry = api_a.post(BULK, {"action": action, "ids": ids, "dry_run": True}, format="json").json()
        assert ScheduleVersion.objects.count() == versions and not Occurrence.objects.filter(forced=True).exists()
        # The dry run predicts, one by one, what the real call then does.
        real = api_a.post(BULK, {"action": action, "ids": ids}, format="json").json()
        assert [(r["id"], r["changed"], r["error"] is None) for r in dry["results"]] == [
            (r["id"], r["changed"], r["error"] is None) for r in real["results"]
        ], action
        assert dry["changed"] == real["changed"]


def test_bulk_by_ids_reports_ids_it_does_not_know_and_refuses_per_schedule(api_a, api_b):
    made = fleet(api_a)
    foreign = create(api_b, "b-own")
    api_a.post(f"{SCHEDULES}{made['search']['id']}/cancel/", {}, format="json")

    result = api_a.post(
        BULK, {"action": "trigger", "ids": [made["pay-prod"]["id"], made["search"]["id"], foreign["id"]]}, format="json"
    ).json()

    by_id = {r["id"]: r for r in result["results"]}
    assert result["matched"] == 2 and result["changed"] == 1
    assert by_id[made["pay-prod"]["id"]]["occurrence_id"] is not None
    assert by_id[made["search"]["id"]]["error"] == "A canceled schedule cannot be triggered."
    assert by_id[foreign["id"]] == {**by_id[foreign["id"]], "state": None, "error": "No such schedule."}
    assert Occurrence.objects.filter(schedule_id=foreign["id"], forced=True).count() == 0


def test_a_bulk_body_needs_exactly_one_of_selector_and_ids(api_a):
    for body in (
        {"action": "pause"},
        {"action": "pause", "selector": "team=x", "ids": ["00000000-0000-0000-0000-000000000001"]},
        {"action": "pause", "selector": ""},
        {"action": "explode", "selector": "team=x"},
        {"action": "pause", "selector": "team=x", "colour": "red"},
    ):
        response = api_a.post(BULK, body, format="json")
        assert response.status_code == 400, (body, response.content)


def test_bulk_refuses_more_than_the_cap_before_changing_anything(api_a, tenant, monkeypatch):
    monkeypatch.setattr("schedules.fleet.MAX_FLEET", 2)
    fleet(api_a)
    response = api_a.post(BULK, {"action": "pause", "selector": "team=payments"}, format="json")
    assert response.status_code == 400 and "at most 2" in response.json()["selector"][0]
    assert not Schedule.objects.filter(tenant=tenant, state="paused").exists()
    assert MAX_FLEET == 10_000


def test_applying_an_export_changes_nothing(api_a, tenant):
    fleet(api_a)
    create(api_a, "every-90s", {"team": "payments"}, kind="interval", every_seconds=90, cron=None)
    create(api_a, "once", run_at=(db_now() + timedelta(days=1)).isoformat(), kind="once", cron=None)
    exported = api_a.get(EXPORT).json()["schedules"]
    assert {s["name"] for s in exported} == {"pay-prod", "pay-dev", "pay-bare", "search", "every-90s", "once"}
    assert "id" not in exported[0] and "state" not in exported[0] and "version" not in exported[0]
    versions = ScheduleVersion.objects.count()

    result = api_a.post(APPLY, {"schedules": exported}, format="json").json()

    assert result == {
        "created": [],
        "updated": [],
        "unchanged": sorted(result["unchanged"]),
        "canceled": [],
        "failed": [],
    }
    assert len(result["unchanged"]) == 6 and ScheduleVersion.objects.count() == versions


def test_apply_creates_updates_and_prunes_by_name_within_the_selector(api_a, tenant):
    fleet(api_a)
    document = api_a.get(EXPORT, {"selector": "team=payments"}).json()["schedules"]
    assert {s["name"] for s in document} == {"pay-prod", "pay-dev", "pay-bare"}
    by_name = {s["name"]: s for s in document}
    by_name["pay-prod"]["cron"] = "0 * * * *"
    del by_name["pay-dev"]
    new = {"name": "pay-new", "kind": "cron", "cron": "0 3 * * *", "handler": "noop", "labels": {"team": "payments"}}
    body = {"schedules": [*by_name.values(), new], "selector": "team=payments", "prune": True}

    dry = api_a.post(APPLY, {**body, "dry_run": True}, format="json").json()
    assert not Schedule.objects.filter(tenant=tenant, name="pay-new").exists()
    result = api_a.post(APPLY, body, format="json").json()

    expected = {
        "created": ["pay-new"],
        "updated": ["pay-prod"],
        "unchanged": ["pay-bare"],
        "canceled": ["pay-dev"],
        "failed": [],
    }
    assert dry == expected and result == expected
    state = dict(Schedule.objects.filter(tenant=tenant).values_list("name", "state"))
    assert state == {
        "pay-new": "active",
        "pay-prod": "active",
        "pay-bare": "active",
        "pay-dev": "canceled",
        "search": "active",
    }  # outside the selector: never pruned
    assert Schedule.objects.get(tenant=tenant, name="pay-prod").cron == "0 * * * *"
    assert api_a.post(APPLY, body, format="json").json()["unchanged"] == ["pay-bare", "pay-new", "pay-prod"]


def test_apply_refuses_a_name_the_tenant_holds_twice_and_a_bad_document_before_any_change(api_a, tenant):
    create(api_a, "twin")
    create(api_a, "twin")
    twin = {"name": "twin", "kind": "cron", "cron": "0 * * * *", "handler": "noop"}
    fresh = {"name": "fresh", "kind": "cron", "cron": "0 * * * *", "handler": "noop"}
    refused = api_a.post(APPLY, {"schedules": [twin, fresh]}, format="json")
    assert refused.status_code == 400 and "twin" in refused.json()["schedules"][0]
    nowhere = api_a.post(APPLY, {"schedules": [{**fresh, "exclude_calendars": ["nope"]}]}, format="json")
    assert nowhere.status_code == 400 and "item 0 ('fresh'): exclude_calendars" in nowhere.json()["schedules"][0]
    bad = api_a.post(APPLY, {"schedules": [fresh, {**fresh, "name": "bad", "cron": "61 * * * *"}]}, format="json")
    assert bad.status_code == 400 and "item 1 ('bad'): cron" in bad.json()["schedules"][0]
    repeated = api_a.post(APPLY, {"schedules": [fresh, fresh]}, format="json")
    assert repeated.status_code == 400
    assert not Schedule.objects.filter(tenant=tenant, name="fresh").exists()


def test_version_history_lists_every_version_newest_first_with_actor_and_note(api_a, api_b):
    made = create(api_a, "history")
    api_a.post(f"{SCHEDULES}{made['id']}/pause/", {"note": "holiday"}, format="json")
    api_a.patch(f"{SCHEDULES}{made['id']}/", {"cron": "0 9 * * *"}, format="json")

    versions = api_a.get(f"{SCHEDULES}{made['id']}/versions/").json()

    assert [(v["version"], v["change"], v["note"]) for v in versions] == [
        (3, "update", ""),
        (2, "pause", "holiday"),
        (1, "create", ""),
    ]
    assert set(versions[0]) == {"version", "created_at", "actor", "note", "change", "definition"}
    assert versions[0]["definition"]["cron"] == "0 9 * * *" and versions[2]["actor"].startswith("tenant:")
    assert api_b.get(f"{SCHEDULES}{made['id']}/versions/").status_code == 404


def test_backfill_through_the_api_creates_the_missing_fires_once(api_a, tenant):
    created_at = db_now() - timedelta(hours=2)
    schedule = schedule_for(tenant, name="hourly", cron="0 * * * *", now=created_at)
    until = db_now().replace(minute=0, second=0, microsecond=0)
    body = {"since": (until - timedelta(hours=1)).isoformat(), "until": until.isoformat()}

    first = api_a.post(f"{SCHEDULES}{schedule.id}/backfill/", body, format="json")
    second = api_a.post(f"{SCHEDULES}{schedule.id}/backfill/", body, format="json")

    assert first.status_code == 202 and first.json() == {"expected": 1, "created": 1, "already_present": 0}
    assert second.json() == {"expected": 1, "created": 0, "already_present": 1}
    future = {"since": until.isoformat(), "until": (until + timedelta(days=1)).isoformat()}
    refused = api_a.post(f"{SCHEDULES}{schedule.id}/backfill/", future, format="json")
    assert refused.status_code == 400 and "later than now" in refused.json()["detail"]


def test_a_bulk_call_may_name_ten_thousand_ids(api_a):
    made = create(api_a, "one")
    ids = [made["id"], *(f"00000000-0000-4000-8000-{n:012d}" for n in range(MAX_FLEET - 1))]

    response = api_a.post(BULK, {"action": "pause", "ids": ids, "dry_run": True}, format="json")

    assert response.status_code == 200, response.content[:300]
    assert response.json()["matched"] == 1 and len(response.json()["results"]) == MAX_FLEET


def test_prune_and_export_see_live_schedules_only(api_a, tenant):
    for _ in range(2):  # two one-offs of one name that ran: history, not a fleet
        done = create(api_a, "report", kind="once", cron=None, run_at=(db_now() + timedelta(days=1)).isoformat())
        Schedule.objects.filter(pk=done["id"]).update(state="completed")
    keep = create(api_a, "keep")
    create(api_a, "drop")
    document = [s for s in api_a.get(EXPORT).json()["schedules"] if s["name"] == "keep"]

    result = api_a.post(APPLY, {"schedules": document, "prune": True}, format="json").json()

    assert {s["name"] for s in api_a.get(EXPORT).json()["schedules"]} == {"keep"}
    assert (result["canceled"], result["unchanged"]) == (["drop"], ["keep"])
    assert Schedule.objects.filter(tenant=tenant, name="report", state="completed").count() == 2
    assert Schedule.objects.get(pk=keep["id"]).state == "active"


def test_a_selector_scoped_apply_never_reaches_outside_its_selector(api_a, tenant):
    create(api_a, "nightly", {"team": "search"})
    mine = {"name": "nightly", "kind": "cron", "cron": "0 4 * * *", "handler": "noop", "labels": {"team": "payments"}}
    unlabelled = {"name": "other", "kind": "cron", "cron": "0 4 * * *", "handler": "noop"}

    for document in (mine, unlabelled):
        response = api_a.post(APPLY, {"schedules": [document], "selector": "team=payments"}, format="json")
        assert response.status_code == 400, response.content
    assert Schedule.objects.get(tenant=tenant, name="nightly").labels == {"team": "search"}
    assert not Schedule.objects.filter(tenant=tenant, name="other").exists()


def test_a_dry_run_apply_over_the_quota_answers_the_real_429(api_a, tenant):
    tenant.max_schedules = 1
    tenant.save(update_fields=["max_schedules"])
    create(api_a, "one")
    two = {"name": "two", "kind": "cron", "cron": "0 4 * * *", "handler": "noop"}
    one = {"name": "one", "kind": "cron", "cron": "*/5 * * * *", "handler": "noop"}

    dry = api_a.post(APPLY, {"schedules": [one, two], "dry_run": True}, format="json")
    pruning = api_a.post(APPLY, {"schedules": [two], "prune": True, "dry_run": True}, format="json")

    assert dry.status_code == 429
    assert pruning.status_code == 200 and pruning.json()["canceled"] == ["one"]  # pruning frees the slot first
    assert api_a.post(APPLY, {"schedules": [two], "prune": True}, format="json").json()["created"] == ["two"]


def test_a_dry_run_resume_predicts_a_one_off_that_can_no_longer_fire_completes(api_a):
    soon = create(api_a, "soon", kind="once", cron=None, run_at=(db_now() + timedelta(days=1)).isoformat())
    api_a.post(f"{SCHEDULES}{soon['id']}/pause/", {}, format="json")
    Schedule.objects.filter(pk=soon["id"]).update(run_at=db_now() - timedelta(hours=1))

    dry = api_a.post(BULK, {"action": "resume", "ids": [soon["id"]], "dry_run": True}, format="json").json()
    real = api_a.post(BULK, {"action": "resume", "ids": [soon["id"]]}, format="json").json()

    assert dry["results"][0]["state"] == real["results"][0]["state"] == "completed"


def test_a_bulk_trigger_retried_with_its_idempotency_key_fires_once(api_a):
    made = create(api_a, "key")
    body = {"action": "trigger", "ids": [made["id"]]}
    first = api_a.post(BULK, body, format="json", HTTP_IDEMPOTENCY_KEY="deploy-42").json()
    again = api_a.post(BULK, body, format="json", HTTP_IDEMPOTENCY_KEY="deploy-42").json()
    assert first["results"][0]["occurrence_id"] == again["results"][0]["occurrence_id"]
    assert Occurrence.objects.filter(schedule_id=made["id"], manual=True).count() == 1


def test_ids_are_json_text_and_versions_take_no_query_parameters(api_a):
    made = create(api_a, "strict")
    assert api_a.post(BULK, {"action": "pause", "ids": [1]}, format="json").status_code == 400
    response = api_a.get(f"{SCHEDULES}{made['id']}/versions/", {"bogus": "1"})
    assert response.status_code == 400 and "bogus" in response.json()


def test_a_label_value_may_hold_an_equals_sign_and_still_be_selected(api_a):
    create(api_a, "expr", {"expr": "a=b"})
    assert names(api_a.get(SCHEDULES, {"selector": "expr=a=b"})) == ["expr"]
    assert names(api_a.get(SCHEDULES, {"selector": "expr!=a=b"})) == []
