"""The built-in `webhook` handler: POST the payload as JSON, keyed for the receiver's deduplication and signed.

The receiver gets `Idempotency-Key: <occurrence_id>`, the same on every retry, failover and replay: at-least-once
delivery becomes one business effect only where the receiver deduplicates on it (docs/ARCHITECTURE.md rule 5).
Every call is signed with the tenant's secret in the Standard Webhooks format (core/webhook_signatures.py), whose
`webhook-id` is that same occurrence_id.

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
import ipaddress
import json
import logging
import re
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection

from core.sealing import seal, unseal
from core.webhook_signatures import key_of, new_secret, signature
from dispatch.errors import CanceledError, PermanentError, TransientError
from dispatch.handlers import handler
from dispatch.handlers.addresses import refused_address
from dispatch.handlers.http_call import Budget, CallCanceled, DeadlinePassed, request
from dispatch.identity import utc_key
from dispatch.sql.control_plane import MAKE_WEBHOOK_SECRET, WEBHOOK_SIGNING_SECRETS

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_TIMEOUT_SECONDS = 60.0
# Payload keys that configure the call rather than travel in it.
CONTROL_KEYS = ("url", "timeout_seconds", "method", "headers")
METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET")
# Methods whose request carries the JSON body.
METHODS_WITH_BODY = ("POST", "PUT", "PATCH")
# Headers a payload may not set: the connection's own, and the ones the platform signs and keys each call with.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)
MAX_HEADERS = 50
MAX_HEADER_VALUE = 8192
# An HTTP header name (RFC 9110 token).
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
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
    except UnicodeError as exc:
        # A label over 63 characters: no answer will ever come, so no retry.
        raise PermanentError(f"payload.url host {host[:80]!r} is not a valid host name: {exc}") from None
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


def payload_problems(payload: dict[str, Any]) -> list[str]:
    """What would make every call of this payload fail, found before the schedule is saved: a URL that is missing,
    not http(s), with credentials, with a host name that cannot be one, or a refused address written as a literal;
    an unknown method; a header that is reserved or malformed; a timeout that is not a positive number."""
    problems = url_problems(payload.get("url"))
    method = payload.get("method", "POST")
    if method not in METHODS:
        problems.append(f"payload.method must be one of {', '.join(METHODS)}.")
    problems += _header_problems(payload.get("headers", {}))
    timeout = payload.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf"):
        problems.append(
            f"payload.timeout_seconds must be a number of seconds above 0 (at most {MAX_TIMEOUT_SECONDS:g} apply)."
        )
    return problems


def url_problems(url: Any) -> list[str]:
    """What makes `url` uncallable (the webhook's and the notifications' URL rule); none: fine."""
    if not isinstance(url, str) or not url:
        return ["payload.url is required: the http or https URL to call."]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [f"payload.url must be an http or https URL with a host, got {_shown(url)!r}."]
    if parts.username is not None or parts.password is not None:
        return ["payload.url must not carry credentials: send them in payload.headers (e.g. Authorization)."]
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as exc:
        return [f"payload.url has a bad port: {exc}."]
    host = parts.hostname
    try:
        host.encode("idna")
    except UnicodeError:
        return [f"payload.url host {host[:80]!r} is not a valid host name (each label at most 63 characters)."]
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return []
    if not settings.SCHEDULER_WEBHOOK_ALLOW_PRIVATE and refused_address(str(literal)):
        return [f"payload.url {host} is a loopback, private, link-local or reserved address."]
    return []


def _header_problems(headers: Any) -> list[str]:
    if not isinstance(headers, dict):
        return ["payload.headers must be an object of header names to text values."]
    if len(headers) > MAX_HEADERS:
        return [f"payload.headers holds at most {MAX_HEADERS} headers."]
    problems = []
    for name, value in headers.items():
        if not HEADER_NAME.fullmatch(name):
            problems.append(f"payload.headers name {name[:60]!r} is not a header name.")
        elif name.lower() in RESERVED_HEADERS:
            problems.append(f"payload.headers may not set {name}: the platform sets it on every call.")
        elif not isinstance(value, str) or len(value) > MAX_HEADER_VALUE or any(c in value for c in "\r\n\0"):
            problems.append(f"payload.headers {name} must be text of at most {MAX_HEADER_VALUE} characters, one line.")
    return problems


def _shown(url: str) -> str:
    """The URL as logs and messages show it: without credentials, query or fragment (tokens travel there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"[:200]


@handler("webhook", payload_check=payload_problems)
def webhook(context: Any) -> None:
    """Call payload["url"] with payload["method"] (POST) and payload["headers"], sending payload["body"] (or the
    payload without its control keys) as JSON."""
    payload = context.payload or {}
    problems = payload_problems(payload)
    if problems:
        # Saved before the check existed, or changed under it: no call can succeed.
        raise PermanentError(problems[0])
    url, method = payload["url"], payload.get("method", "POST")
    shown = f"{method} {_shown(url)}"
    body = payload["body"] if "body" in payload else {k: v for k, v in payload.items() if k not in CONTROL_KEYS}
    timeout = min(float(payload.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)), MAX_TIMEOUT_SECONDS)
    seconds_left = getattr(context, "seconds_left", None)
    if seconds_left is not None:
        timeout = max(0.1, min(timeout, seconds_left()))
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() if method in METHODS_WITH_BODY else b""
    status = signed_call(
        tenant_id=context.tenant_id,
        message_id=str(context.occurrence_id),
        url=url,
        method=method,
        raw=raw,
        headers={
            # The payload's own (an Authorization, say) may replace the defaults, never the keys below.
            **payload.get("headers", {}),
            "Idempotency-Key": str(context.occurrence_id),
            "X-Scheduled-For": utc_key(context.scheduled_for),
            "X-Attempt": str(context.attempt),
        },
        timeout=timeout,
        cancel_event=context.cancel_event,
    )
    logger.info(
        "webhook %s answered %d for occurrence %s",
        shown,
        status,
        context.occurrence_id,
        extra={"action": "webhook", "occurrence_id": str(context.occurrence_id)},
    )


def signed_call(
    *,
    tenant_id: int,
    message_id: str,
    url: str,
    method: str,
    raw: bytes,
    headers: dict[str, str],
    timeout: float,
    cancel_event: threading.Event,
) -> int:
    """One call of `url` under the address rule, signed with the tenant's keys (`message_id` is its webhook-id),
    within `timeout` for the whole call. Returns the 2xx status; raises TransientError (retry), PermanentError (no
    retry) or CanceledError (the event was set). Shared by the webhook handler and the notifications."""
    shown = f"{method} {_shown(url)}"
    if cancel_event.is_set():
        raise CanceledError("canceled before the request was sent")
    budget = Budget(timeout, cancel_event)
    parts = urlsplit(url)
    try:
        answer = request(
            scheme=parts.scheme,
            host=parts.hostname or "",
            port=parts.port or (443 if parts.scheme == "https" else 80),
            address=_checked_address(url),
            method=method,
            target=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            body=raw,
            headers={
                "Content-Type": "application/json",
                "User-Agent": "scheduler-webhook/1",
                **headers,
                **signed_headers(tenant_id, message_id, raw),
            },
            budget=budget,
            keep_body=ERROR_BODY_BYTES,
        )
    except DeadlinePassed:
        raise TransientError(
            f"{shown} timed out: no complete answer within {timeout:.1f} s (timeout_seconds, the whole call)"
        ) from None
    except CallCanceled:
        raise CanceledError(f"{shown} canceled after {budget.elapsed():.1f} s by the worker") from None
    except http.client.HTTPException as exc:
        # A status line or headers malformed, or the connection closed before the answer was whole.
        problem = f"{type(exc).__name__}: {exc}"
        raise TransientError(f"{shown} failed: incomplete or malformed answer ({problem})") from exc
    except OSError as exc:
        # Connection refused or reset, a TLS failure.
        raise TransientError(f"{shown} failed: {exc}") from exc
    _raise_for_status(shown, answer.status, answer.body_head, answer.headers.get("Retry-After"))
    return answer.status


def signing_keys(tenant_id: int) -> list[bytes]:
    """The keys that sign a call of this tenant now: one, or two during a rotation's overlap."""
    with connection.cursor() as cursor:
        cursor.execute(WEBHOOK_SIGNING_SECRETS, {"tenant_id": tenant_id})
        row = cursor.fetchone()
        if row is None:
            cursor.execute(MAKE_WEBHOOK_SECRET, {"tenant_id": tenant_id, "sealed": seal(new_secret())})
            cursor.execute(WEBHOOK_SIGNING_SECRETS, {"tenant_id": tenant_id})
            row = cursor.fetchone()
    return [key_of(unseal(sealed)) for sealed in row if sealed]


def signed_headers(tenant_id: int, message_id: str, raw: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of one call (core/webhook_signatures.py): the timestamp is this attempt's, by
    the wall clock, since receivers compare it with theirs."""
    timestamp = int(time.time())
    keys = signing_keys(tenant_id)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(keys, message_id, timestamp, raw),
    }


def _raise_for_status(shown: str, status: int, body_head: bytes, retry_after: str | None) -> None:
    """2xx is the success; redirects are not followed (a redirected POST would go wherever the target points)."""
    if 200 <= status < 300:
        return
    detail = body_head.decode(errors="replace")
    message = f"{shown} answered {status}: {detail}".strip()
    if status >= 500 or status in RETRYABLE_4XX:
        raise TransientError(message, retry_after=_retry_after(retry_after))
    raise PermanentError(message)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds; the HTTP-date form is ignored (the backoff still applies)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
