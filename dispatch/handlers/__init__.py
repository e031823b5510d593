"""The registry of handlers that occurrences run; the control plane accepts only registered names."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

Handler = Callable[[Any], Any]
# A handler's check of a payload before a schedule with it is saved: the problems, in words (none: fine).
PayloadCheck = Callable[[dict[str, Any]], list[str]]
_registry: dict[str, Handler] = {}
_payload_checks: dict[str, PayloadCheck] = {}


def handler(name: str, *, payload_check: PayloadCheck | None = None) -> Callable[[Handler], Handler]:
    """Register `fn` under `name`. Handlers receive a context with occurrence_id (their idempotency key).
    `payload_check` lets the control plane refuse a payload the handler could never run (a 400 on create or
    change) instead of the occurrence failing when it fires."""

    def register(fn: Handler) -> Handler:
        if name in _registry and _registry[name] is not fn:
            raise ValueError(f"handler {name!r} is already registered")
        _registry[name] = fn
        if payload_check is not None:
            _payload_checks[name] = payload_check
        return fn

    return register


def payload_problems(name: str, payload: dict[str, Any]) -> list[str]:
    """What handler `name` finds wrong with `payload` before it runs (none for a handler without a check)."""
    check = _payload_checks.get(name)
    return check(payload) if check is not None else []


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
