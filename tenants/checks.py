"""Deployment checks of what this project adds (`manage.py check --deploy`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Warning, register


@register(deploy=True)
def secrets_sealed_by_their_own_keys(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    if settings.SCHEDULER_ENCRYPTION_KEYS:
        return []
    return [
        Warning(
            "SCHEDULER_ENCRYPTION_KEYS is not set: webhook secrets are sealed with a key derived from SECRET_KEY, so "
            "whoever holds a copy of the database and SECRET_KEY can open them.",
            hint="Set SCHEDULER_ENCRYPTION_KEYS to a Fernet key kept apart from SECRET_KEY (docs/API.md).",
            id="scheduler.W001",
        )
    ]
