"""`manage.py provision_demo`: the demo tenant with a handful of realistic schedules and an operator login."""

from __future__ import annotations

import io
import os
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from core.clock import db_now
from schedules.calendars import create_calendar
from schedules.models import Calendar
from schedules.services import create_schedule, pause_schedule
from tenants.services import provision_tenant

DEMO_SLUG = "demo"
DEMO_DOMAIN = "demo.localhost"
# A second, busier tenant held to small quotas, so the console shows fairness and throttling at work.
BUSY_SLUG = "analytics"
BUSY_DOMAIN = "analytics.localhost"
BUSY_SCHEDULES = 120
BUSY_QUOTAS = {"max_fires_per_second": 20, "max_running": 5, "fairness_weight": 1}
OPERATOR_USERNAME = "operator"
# A read-only operator of the demo tenant only: the console as a tenant-scoped role sees it (tenants/access.py).
VIEWER_USERNAME = "demo-viewer"
# The demo schedule that starts paused, with a note and the instant it resumes by itself.
PAUSED_UNTIL = ("partner-export", "partner freeze during their migration, CHG-204", timedelta(days=1))


# The demo tenant's holiday calendar (Spain's national holidays), which the stand-up reminder skips.
HOLIDAYS = {
    "name": "es-holidays",
    "description": "Spain's national holidays",
    "dates": [
        *("2026-01-01", "2026-01-06", "2026-04-03", "2026-05-01", "2026-08-15", "2026-10-12", "2026-11-01"),
        *("2026-12-06", "2026-12-08", "2026-12-25", "2027-01-01", "2027-01-06", "2027-03-26", "2027-05-01"),
        *("2027-08-15", "2027-10-12", "2027-11-01", "2027-12-06", "2027-12-08", "2027-12-25"),
    ],
}


# Labels, so the console's selector box and the fleet API have something to pick: a team and an environment each.
DEMO_LABELS: dict[str, dict[str, str]] = {
    "heartbeat": {"team": "platform", "env": "prod"},
    "nightly-report": {"team": "finance", "env": "prod"},
    "standup-reminder": {"team": "people", "env": "prod"},
    "inventory-sync": {"team": "supply", "env": "prod"},
    "quarter-hour-poll": {"team": "supply", "env": "staging"},
    "warm-up-probe": {"team": "platform", "env": "staging"},
    "crm-webhook": {"team": "sales", "env": "prod"},
    "queue-depth-probe": {"team": "platform", "env": "prod"},
    "partner-export": {"team": "finance", "env": "prod"},
    "welcome-email": {"team": "sales", "env": "prod"},
}


def demo_schedules(now: Any) -> list[dict[str, Any]]:
    """What a small team would really schedule: a heartbeat, reports in local time, a flexible sync, a fixed-rate
    probe, a one-off."""
    return [
        {"name": "heartbeat", "kind": "cron", "cron": "* * * * *", "handler": "log", "timezone": "UTC"},
        {
            "name": "nightly-report",
            "kind": "cron",
            "cron": "30 2 * * *",
            "timezone": "America/New_York",
            "handler": "log",
            "payload": {"report": "daily-sales"},
        },
        {
            "name": "standup-reminder",
            "kind": "cron",
            "cron": "0 9 * * mon-fri",
            "timezone": "Europe/Madrid",
            "handler": "log",
            "priority": 10,
            "exclude_calendars": [HOLIDAYS["name"]],
        },
        {
            "name": "inventory-sync",
            "kind": "cron",
            "cron": "*/5 * * * *",
            "timezone": "Asia/Kolkata",
            "handler": "noop",
            "lane": "flexible",
            "flexible_window_seconds": 120,
        },
        {
            # Fires at both instants of Lord Howe's repeated half hour: never silent on the night clocks go back.
            "name": "quarter-hour-poll",
            "kind": "cron",
            "cron": "*/15 * * * *",
            "timezone": "Australia/Lord_Howe",
            "dst_repeat": "both",
            "handler": "noop",
            "overlap_policy": "skip_if_running",
        },
        {
            # Five runs, a minute apart, then completed: the list counts them down.
            "name": "warm-up-probe",
            "kind": "interval",
            "every_seconds": 60,
            "max_runs": 5,
            "handler": "noop",
        },
        {
            # Points at a port on this machine: the webhook handler refuses private addresses, so every run ends
            # dead with its reason, and the DLQ (and its replay) has something to show.
            "name": "crm-webhook",
            "kind": "cron",
            "cron": "*/2 * * * *",
            "timezone": "UTC",
            "handler": "webhook",
            # A name that never resolves (.invalid): each fire fails, and the DLQ shows what a dead fire looks like.
            "payload": {"url": "http://crm.invalid/hooks/crm"},
            "max_attempts": 1,
        },
        {
            # Every 90 s in elapsed time: London's clock changes never move it, they only relabel its local times.
            "name": "queue-depth-probe",
            "kind": "interval",
            "every_seconds": 90,
            "timezone": "Europe/London",
            "handler": "noop",
        },
        {
            # Paused over a freeze when first provisioned (see PAUSED_UNTIL): resumes by itself a day later.
            "name": "partner-export",
            "kind": "cron",
            "cron": "0 */6 * * *",
            "timezone": "Europe/Berlin",
            "handler": "log",
            "payload": {"partner": "acme-logistics"},
        },
        {
            "name": "welcome-email",
            "kind": "once",
            "run_at": (now + timedelta(minutes=2)).replace(microsecond=0),
            "handler": "log",
            "payload": {"to": "new-user@example.com"},
        },
    ]


class Command(BaseCommand):
    help = "Provision the demo tenant (demo.localhost) with sample schedules and an operator login; idempotent."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="port the web server will listen on")

    def handle(self, *args, **options) -> None:
        port = options["port"]
        demo = provision_tenant(DEMO_SLUG, domain=DEMO_DOMAIN, name="Demo Inc.")
        now = db_now()
        created = 0
        if not Calendar.objects.filter(tenant=demo.tenant, name=HOLIDAYS["name"]).exists():
            create_calendar(tenant=demo.tenant, data=HOLIDAYS, actor="operator:demo-setup")
        for body in demo_schedules(now):
            # The name is the idempotency key, so running the demo twice does not duplicate schedules.
            schedule, was_created = create_schedule(
                tenant=demo.tenant,
                data={**body, "labels": DEMO_LABELS.get(body["name"], {})},
                actor="operator:demo-setup",
                idempotency_key=f"demo:{body['name']}",
                request_fingerprint=f"demo:{body['name']}",
            )
            created += was_created
            name, note, pause_for = PAUSED_UNTIL
            if was_created and body["name"] == name:
                pause_schedule(schedule, actor="operator:demo-setup", note=note, resume_at=now + pause_for)
        busy = provision_tenant(BUSY_SLUG, domain=BUSY_DOMAIN, name="Analytics Ltd.", **BUSY_QUOTAS)
        for n in range(BUSY_SCHEDULES):
            body = {
                "name": f"refresh-dashboard-{n:03d}",
                "kind": "cron",
                "cron": "* * * * *",
                "timezone": "Europe/London",
                "handler": "noop",
                "labels": {"team": "analytics", "env": "prod"},
            }
            _, was_created = create_schedule(
                tenant=busy.tenant,
                data=body,
                actor="operator:demo-setup",
                idempotency_key=f"demo:{body['name']}",
                request_fingerprint=f"demo:{body['name']}",
            )
            created += was_created
        password = os.environ.get("DEMO_OPERATOR_PASSWORD", "scheduler-demo")
        call_command("ensure_operator", username=OPERATOR_USERNAME, password=password, stdout=io.StringIO())
        viewer_password = f"{password}-viewer"
        call_command(
            "ensure_operator",
            username=VIEWER_USERNAME,
            password=viewer_password,
            role="read-only",
            tenants=DEMO_SLUG,
            stdout=io.StringIO(),
        )

        base = f"http://{DEMO_DOMAIN}:{port}"
        lines = [
            "",
            "Scheduler demo is ready.",
            f"  Operator console : http://localhost:{port}/admin/",
            f"  Operator login   : user {OPERATOR_USERNAME!r}, password {password!r}",
            f"  Read-only of demo: user {VIEWER_USERNAME!r}, password {viewer_password!r} (sees only that tenant)",
            f"  Metrics / health : http://localhost:{port}/metrics   http://localhost:{port}/healthz",
            *(
                [f"  Metrics token    : Authorization: Bearer {settings.SCHEDULER_METRICS_TOKEN}"]
                if settings.SCHEDULER_METRICS_TOKEN
                else []
            ),
            f"  Tenant API       : {base}/api/v1/schedules/   ({created} schedules created now, two tenants)",
            f"  API docs         : {base}/api/v1/docs/",
            f"  API token        : {demo.token}",
            f"  Try: curl -H 'Authorization: Token {demo.token}' {base}/api/v1/schedules/",
            "",
        ]
        self.stdout.write("\n".join(lines))
