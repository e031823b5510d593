"""The metrics inside the console (/admin/metrics/): the figures /metrics serves, as tables an operator reads, with
histograms summed up (observations, mean, bucket bounds of p50/p95/p99). A superuser's page, like the Metrics link
to it: the series name every tenant. The raw Prometheus text stays at /metrics (scheduler_project/metrics.py), for
scrapes (its bearer token when SCHEDULER_METRICS_TOKEN is set) and linked from here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from prometheus_client.core import Metric

from scheduler_project.metrics import SCHEDULER_REGISTRY

# The families an operator looks at first, in this order; every other one is listed below them.
KEY_FAMILIES = (
    "scheduler_live_processes",
    "scheduler_materialization_behind_seconds",
    "scheduler_outbox_envelopes",
    "scheduler_outbox_occurrences",
    "scheduler_outbox_oldest_due_age_seconds",
    "scheduler_outbox_unsettled_envelopes",
    "scheduler_schedule_lag_seconds",
    "scheduler_start_lag_seconds",
    "scheduler_missed_occurrences",
    "scheduler_dlq_occurrences",
    "scheduler_running_occurrences",
    "scheduler_expired_leases",
    "scheduler_queue_messages",
    "scheduler_clock_skew_seconds",
)
QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class FamilyView:
    """One metric family as the page shows it: its name, kind and help, and a row (labels, value in words) per
    series."""

    name: str
    kind: str
    help: str
    rows: list[tuple[str, str]] = field(default_factory=list)


def number(value: float, unit: str = "") -> str:
    """'1,234', '0.042 s', '-1.500 s' (samples come as int, float or Decimal)."""
    value = float(value)
    if not math.isfinite(value):
        return "—" if math.isnan(value) else str(value)
    text = f"{value:,.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:,.3f}"
    return f"{text}{unit}"


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(labels.items())) or "—"


def _quantile_bound(buckets: list[tuple[float, float]], count: float, quantile: float, unit: str) -> str:
    """The upper bound of the bucket the quantile falls in ('≤ 0.25 s'), or above the last bound."""
    for bound, cumulative in buckets:
        if cumulative >= quantile * count:
            return f"≤ {number(bound, unit)}" if math.isfinite(bound) else f"> {number(buckets[-2][0], unit)}"
    return "—"


@dataclass
class _Series:
    """One histogram series' samples: (bound, cumulative count) per bucket, the count and the sum."""

    buckets: list[tuple[float, float]] = field(default_factory=list)
    count: float = 0.0
    total: float = 0.0


def _histogram_rows(metric: Metric, unit: str) -> list[tuple[str, str]]:
    """Per series: its observations, their mean, and the bucket bounds of p50, p95 and p99."""
    series: dict[str, _Series] = defaultdict(_Series)
    for sample in metric.samples:
        found = series[_labels({k: v for k, v in sample.labels.items() if k != "le"})]
        if sample.name.endswith("_bucket"):
            found.buckets.append((float(sample.labels["le"]), sample.value))
        elif sample.name.endswith("_count"):
            found.count = sample.value
        elif sample.name.endswith("_sum"):
            found.total = sample.value
    rows = []
    for key, found in sorted(series.items()):
        if not found.count:
            rows.append((key, "no observations"))
            continue
        buckets = sorted(found.buckets)
        bounds = ", ".join(f"p{q * 100:g} {_quantile_bound(buckets, found.count, q, unit)}" for q in QUANTILES)
        rows.append(
            (key, f"{number(found.count)} observations, mean {number(found.total / found.count, unit)}; {bounds}")
        )
    return rows


def family_view(metric: Metric) -> FamilyView:
    unit = " s" if metric.name.endswith("_seconds") else ""
    if metric.type == "histogram":
        rows = _histogram_rows(metric, unit)
    else:
        rows = [(_labels(sample.labels), number(sample.value, unit)) for sample in metric.samples]
    return FamilyView(metric.name, metric.type, metric.documentation, rows)


def console_metrics(request: HttpRequest) -> TemplateResponse:
    """The page (behind admin.site.admin_view: a signed-in staff user; here a superuser)."""
    if not (request.user.is_active and request.user.is_superuser):
        raise PermissionDenied
    families = {view.name: view for view in map(family_view, SCHEDULER_REGISTRY.collect())}
    context = {
        **admin.site.each_context(request),
        "title": "Metrics",
        "key_families": [families[name] for name in KEY_FAMILIES if name in families],
        "other_families": [view for name, view in sorted(families.items()) if name not in KEY_FAMILIES],
    }
    return TemplateResponse(request, "admin/console_metrics.html", context)
