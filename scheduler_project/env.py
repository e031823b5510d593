"""Typed readers for settings taken from the environment; a bad value stops start-up with a clear message."""

from __future__ import annotations

import base64
import math
import os
import re

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
# A request rate as DRF's throttles parse it (they read only the first letter of the period).
_RATE = re.compile(r"^(\d+)/(s|sec|second|m|min|minute|h|hour|d|day)$")


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off.")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below its minimum {minimum}.")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above its maximum {maximum}.")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number.") from None
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number.")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below its minimum {minimum}.")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above its maximum {maximum}.")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_rate(name: str, default: str) -> str:
    """A request rate such as `6000/min`: a count of at least 1 per s, min, hour or day."""
    raw = os.environ.get(name, default)
    match = _RATE.match(raw.strip().replace(" ", ""))
    if match is None or int(match[1]) < 1:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a request rate; use <count>/<s|min|hour|day> with a count of at least 1, "
            "e.g. 6000/min."
        )
    return f"{int(match[1])}/{match[2]}"


def env_fernet_keys(name: str) -> list[str]:
    """Fernet keys, comma-separated (32 bytes each, URL-safe base64); none when unset."""
    keys = env_list(name, [])
    for key in keys:
        try:
            if len(base64.urlsafe_b64decode(key.encode())) != 32:
                raise ValueError
        except ValueError:
            raise ImproperlyConfigured(
                f"{name} holds a value that is not a Fernet key (32 bytes, URL-safe base64)."
            ) from None
    return keys
