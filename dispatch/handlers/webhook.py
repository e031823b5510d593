"""The built-in `webhook` handler: POST the payload as JSON, keyed for the receiver's deduplication.

The receiver gets `Idempotency-Key: <occurrence_id>`, the same on every retry, failover and replay: at-least-once
delivery becomes one business effect only where the receiver deduplicates on it (docs/ARCHITECTURE.md rule 5).

`timeout_seconds` is a deadline for the whole call (connect, sending, the status line, the headers and the body),
and the worker's cancel event ends a call in flight at once (dispatch/handlers/http_call.py). A call that did not
complete is never a success: a deadline, a connection cut mid-answer or a malformed answer is a transient error
(retried within max attempts and the occurrence deadline), a cancel is a cancel.

A tenant chooses the URL, so the handler refuses loopback, private, link-local (cloud metadata) and reserved
addresses unless the operator sets SCHEDULER_WEBHOOK_ALLOW_PRIVATE=1. The check is made on the resolved address, and
the connection goes to exactly that address (the Host header and TLS name stay the URL's), so a DNS answer that
changes between the check and the connect (rebinding) cannot reach an address that was not checked.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from dispatch.errors import CanceledError, PermanentError, TransientError
from dispatch.handlers import handler
from dispatch.handlers.addresses import refused_address
from dispatch.handlers.http_call import Budget, CallCanceled, DeadlinePassed, request
from dispatch.identity import utc_key

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_TIMEOUT_SECONDS = 60.0
# Payload keys that configure the call rather than travel in it.
CONTROL_KEYS = ("url", "timeout_seconds")
# 408 and 429 are the receiver asking to come back later; every other 4xx will fail the same way again.
RETRYABLE_4XX = frozenset({408, 429})
# Enough of an error response to tell what went wrong.
ERROR_BODY_BYTES = 500


def _checked_address(url: str) -> str:
    """The address to connect to for `url`, after the private-address rule; raises for a refused target."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TransientError(f"cannot resolve {host}: {exc}") from exc
    addresses = [str(info[4][0]) for info in infos]
    if not settings.SCHEDULER_WEBHOOK_ALLOW_PRIVATE:
        refused = [address for address in addresses if refused_address(address)]
        if refused:
            # Every address is checked, not only the first: a name with one public and one private answer is refused.
            raise PermanentError(
                f"payload.url {host} resolves to {refused[0]}, a loopback, private, link-local or reserved address; "
                "the operator can allow such targets with SCHEDULER_WEBHOOK_ALLOW_PRIVATE=1"
            )
    return addresses[0]


@handler("webhook")
def webhook(context: Any) -> None:
    """POST payload["body"] (or the payload without its control keys) to payload["url"]."""
    payload = context.payload or {}
    url = _target(payload.get("url"))
    body = payload["body"] if "body" in payload else {k: v for k, v in payload.items() if k not in CONTROL_KEYS}
    timeout = _timeout(payload.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS))
    seconds_left = getattr(context, "seconds_left", None)
    if seconds_left is not None:
        timeout = max(0.1, min(timeout, seconds_left()))
    if context.cancel_event.is_set():
        raise CanceledError("canceled before the request was sent")
    budget = Budget(timeout, context.cancel_event)
    parts = urlsplit(url)
    try:
        answer = request(
            scheme=parts.scheme,
            host=parts.hostname or "",
            port=parts.port or (443 if parts.scheme == "https" else 80),
            address=_checked_address(url),
            method="POST",
            target=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            body=json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(),
            headers={
                "Content-Type": "application/json",
                "Idempotency-Key": str(context.occurrence_id),
                "X-Scheduled-For": utc_key(context.scheduled_for),
                "X-Attempt": str(context.attempt),
                "User-Agent": "scheduler-webhook/1",
            },
            budget=budget,
            keep_body=ERROR_BODY_BYTES,
        )
    except DeadlinePassed:
        raise TransientError(
            f"POST {url} timed out: no complete answer within {timeout:.1f} s (timeout_seconds, the whole call)"
        ) from None
    except CallCanceled:
        raise CanceledError(f"POST {url} canceled after {budget.elapsed():.1f} s by the worker") from None
    except http.client.HTTPException as exc:
        # A status line or headers malformed, or the connection closed before the answer was whole.
        problem = f"{type(exc).__name__}: {exc}"
        raise TransientError(f"POST {url} failed: incomplete or malformed answer ({problem})") from exc
    except OSError as exc:
        # Connection refused or reset, a TLS failure.
        raise TransientError(f"POST {url} failed: {exc}") from exc
    _raise_for_status(url, answer.status, answer.body_head, answer.headers.get("Retry-After"))
    logger.info(
        "webhook %s answered %d for occurrence %s",
        url,
        answer.status,
        context.occurrence_id,
        extra={"action": "webhook", "occurrence_id": str(context.occurrence_id)},
    )


def _target(url: Any) -> str:
    if not isinstance(url, str) or not url:
        raise PermanentError("payload.url is required")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PermanentError(f"payload.url must be an http or https URL, got {url[:200]!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise PermanentError(f"payload.url has a bad port: {exc}") from None
    return url


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or value != value:
        raise PermanentError(f"payload.timeout_seconds must be a positive number, got {value!r}")
    return min(float(value), MAX_TIMEOUT_SECONDS)


def _raise_for_status(url: str, status: int, body_head: bytes, retry_after: str | None) -> None:
    """2xx is the success; redirects are not followed (a redirected POST would go wherever the target points)."""
    if 200 <= status < 300:
        return
    detail = body_head.decode(errors="replace")
    message = f"POST {url} answered {status}: {detail}".strip()
    if status >= 500 or status in RETRYABLE_4XX:
        raise TransientError(message, retry_after=_retry_after(retry_after))
    raise PermanentError(message)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds; the HTTP-date form is ignored (the backoff still applies)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
