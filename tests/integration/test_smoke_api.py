"""Smoke: a tenant creates a schedule and reads it back on its own host."""

from __future__ import annotations


def test_tenant_creates_and_reads_back_a_schedule(api_a, cron_body):
    created = api_a.post("/api/v1/schedules/", cron_body, format="json")
    assert created.status_code == 201, created.content
    fetched = api_a.get(f"/api/v1/schedules/{created.json()['id']}/")
    assert fetched.status_code == 200
    assert fetched.json()["cron"] == "30 2 * * *"


def test_tenant_b_cannot_see_tenant_a_schedule(api_a, api_b, cron_body):
    created = api_a.post("/api/v1/schedules/", cron_body, format="json").json()
    assert api_b.get(f"/api/v1/schedules/{created['id']}/").status_code == 404
    assert api_b.get("/api/v1/schedules/").json()["count"] == 0
