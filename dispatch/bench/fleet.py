"""The fleet benchmark: what a tenant pays for the fleet calls on N schedules, through the whole API path.

1. Provision `bench-fleet` (its rows of an earlier run are removed first) and create N monthly cron schedules
   through the control plane's service, as the API would (every check, a version row and a cursor each), labelled
   `team=a|b`, `env=prod`.
2. Call the tenant API in this process through Django's test client (routing, token, throttle, serializers, the
   services, JSON both ways; no socket): a bulk pause as a dry run, the bulk pause, a bulk resume, an export, an
   apply of that export (nothing changes) and an apply that changes every schedule's cron.
3. Report each call's wall time and schedules per second, the answer's size, and this process's peak RSS.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from django.test import Client
from tqdm import tqdm

from dispatch.bench.processes import rss_peak_mb
from dispatch.bench.rows import BENCH_TENANT_PREFIX, UNTHROTTLED
from schedules.services import create_schedule
from tenants.deletion import delete_tenant
from tenants.models import Tenant
from tenants.services import provision_tenant

FLEET_TENANT = f"{BENCH_TENANT_PREFIX}fleet"
# Monthly: no schedule falls due during the run, so each change measures the control plane's own work (with a
# materializer running, as in production, a cursor is never left due; without one, every change would first
# materialize the fire it owes).
CRON = "0 3 1 * *"
CHANGED_CRON = "0 4 1 * *"


@dataclass
class FleetConfig:
    schedules: int


class FleetBenchmark:
    def __init__(self, config: FleetConfig, out: Any = sys.stdout) -> None:
        self.config = config
        self.out = out

    def run(self) -> dict[str, Any]:
        n = self.config.schedules
        existing = Tenant.objects.filter(slug=FLEET_TENANT).first()
        if existing is not None:
            delete_tenant(existing, actor="bench")
        quotas = {**UNTHROTTLED, "max_schedules": max(UNTHROTTLED.get("max_schedules", 0), n * 2)}
        provisioned = provision_tenant(FLEET_TENANT, domain=f"{FLEET_TENANT}.localhost", **quotas)
        tenant = provisioned.tenant
        started = time.monotonic()
        for i in tqdm(range(n), desc="create", file=self.out, disable=not self.out.isatty()):
            labels = {"team": "a" if i % 2 else "b", "env": "prod"}
            data = {"name": f"job-{i:06d}", "kind": "cron", "cron": CRON, "handler": "noop", "labels": labels}
            create_schedule(tenant=tenant, data=data, actor="bench")
        created_s = time.monotonic() - started
        client = Client(HTTP_HOST=provisioned.domain, HTTP_AUTHORIZATION=f"Token {provisioned.token}")
        result: dict[str, Any] = {"schedules": n, "create_per_s": round(n / created_s, 1)}
        bulk = "/api/v1/schedules/bulk/"
        self._call(result, "bulk_dry_run", client, bulk, {"action": "pause", "selector": "env=prod", "dry_run": True})
        self._call(result, "bulk_pause", client, bulk, {"action": "pause", "selector": "env=prod", "note": "bench"})
        self._call(result, "bulk_resume", client, bulk, {"action": "resume", "selector": "env=prod"})
        exported = self._call(result, "export", client, "/api/v1/schedules/export/", None)["schedules"]
        apply = "/api/v1/schedules/apply/"
        unchanged = self._call(result, "apply_unchanged", client, apply, {"schedules": exported})
        changed = [{**document, "cron": CHANGED_CRON} for document in exported]
        updated = self._call(result, "apply_updated", client, apply, {"schedules": changed})
        result["apply_unchanged_count"] = len(unchanged["unchanged"])
        result["apply_updated_count"] = len(updated["updated"])
        result["rss_mb_peak"] = rss_peak_mb(os.getpid())
        delete_tenant(Tenant.objects.get(pk=tenant.pk), actor="bench")
        return result

    def _call(self, result: dict[str, Any], name: str, client: Client, path: str, body: dict | None) -> dict:
        started = time.monotonic()
        if body is None:
            response = client.get(path)
        else:
            response = client.post(path, json.dumps(body), content_type="application/json")
        elapsed = time.monotonic() - started
        if response.status_code != 200:
            raise RuntimeError(f"{name}: {response.status_code} {response.content[:300]!r}")
        result[f"{name}_s"] = round(elapsed, 3)
        result[f"{name}_per_s"] = round(self.config.schedules / elapsed, 1)
        result[f"{name}_bytes"] = len(response.content)
        self.out.write(f"{name}: {elapsed:.2f} s\n")
        return response.json()
