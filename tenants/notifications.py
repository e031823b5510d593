"""A tenant's notification target (docs/API.md, "Notifications"): where and of which events it is told that a fire
did not run. The data plane writes and sends the notifications (dispatch/notifications.py); this keeps the
setting, checked with the same URL rule as a webhook."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from core.labels import SelectorInvalid, parse_selector
from dispatch.services import url_problems
from tenants.errors import FieldsInvalid
from tenants.models import NotificationEvent, NotificationTarget, Tenant

logger = logging.getLogger(__name__)


def clean_target(url: Any, events: Any, selector: Any) -> dict[str, Any]:
    errors: dict[str, list[str]] = {}
    problems = url_problems(url)
    if problems:
        errors["url"] = [problem.replace("payload.url", "url") for problem in problems]
    if (
        not isinstance(events, list)
        or not events
        or not all(isinstance(e, str) and e in NotificationEvent.values for e in events)
        or len(set(events)) != len(events)
    ):
        errors["events"] = [f"A non-empty list of distinct events among {', '.join(NotificationEvent.values)}."]
    try:
        chosen = parse_selector(selector)
    except SelectorInvalid as exc:
        errors["selector"] = [str(exc)]
    if errors:
        raise FieldsInvalid(errors)
    return {
        "url": url,
        "events": sorted(events, key=NotificationEvent.values.index),
        "selector": str(chosen),
        "selector_match": None if chosen.empty else chosen.as_match(),
    }


def set_target(
    tenant: Tenant, *, url: Any, events: Any, selector: Any, actor: str, now: datetime
) -> NotificationTarget:
    """Create or replace the tenant's target; events it writes from now on go there (those waiting too)."""
    fields = clean_target(url, events, selector)
    target, _ = NotificationTarget.objects.update_or_create(
        tenant=tenant, defaults={**fields, "updated_at": now, "updated_by": actor[:200]}
    )
    logger.info("%s set the notification target of tenant %s", actor, tenant.slug, extra={"action": "notifications"})
    return target


def target_of(tenant: Tenant) -> NotificationTarget | None:
    return NotificationTarget.objects.filter(tenant=tenant).first()


def clear_target(tenant: Tenant, *, actor: str) -> bool:
    """No more notifications; those not yet sent are given up when next taken. False when there was no target."""
    deleted, _ = NotificationTarget.objects.filter(tenant=tenant).delete()
    if deleted:
        logger.info("%s removed the notification target of tenant %s", actor, tenant.slug)
    return bool(deleted)
