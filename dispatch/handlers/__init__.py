"""The registry of handlers that occurrences run; the control plane accepts only registered names."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

Handler = Callable[[Any], Any]
_registry: dict[str, Handler] = {}


def handler(name: str) -> Callable[[Handler], Handler]:
    """Register `fn` under `name`. Handlers receive a context with occurrence_id (their idempotency key)."""

    def register(fn: Handler) -> Handler:
        if name in _registry and _registry[name] is not fn:
            raise ValueError(f"handler {name!r} is already registered")
        _registry[name] = fn
        return fn

    return register


def is_registered(name: str) -> bool:
    return name in _registry


def get_handler(name: str) -> Handler:
    return _registry[name]


def registered_names() -> list[str]:
    return sorted(_registry)


@handler("noop")
def noop(context: Any) -> None:
    """Does nothing: for checking the pipeline end to end."""


@handler("log")
def log(context: Any) -> None:
    """Writes the occurrence to the log: the simplest visible effect."""
    logger.info(
        "occurrence %s fired (scheduled for %s)",
        getattr(context, "occurrence_id", None),
        getattr(context, "scheduled_for", None),
        extra={"action": "handler_log"},
    )
