"""The built-in `webhook` handler: POST the payload as JSON, keyed for the receiver's deduplication.

The receiver gets `Idempotency-Key: <occurrence_id>`, the same on every retry, failover and replay: at-least-once
delivery becomes one business effect only where the receiver deduplicates on it (seed 000).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from dispatch.errors import CanceledError, PermanentError, TransientError
from dispatch.handlers import handler
from dispatch.identity import utc_key

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_TIMEOUT_SECONDS = 60.0
# Payload keys that configure the call rather than travel in it.
CONTROL_KEYS = ("url", "timeout_seconds")
# 408 and 429 are the receiver asking to come back later; every other 4xx will fail the same way again.
RETRYABLE_4XX = frozenset({408, 429})
# Enough of an error response to tell what went wrong, without reading an unbounded body.
ERROR_BODY_BYTES = 500


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """urllib would turn a redirected POST into a GET without body and send it to wherever the target points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects)


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
    request = urllib.request.Request(
        url,
        data=json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": str(context.occurrence_id),
            "X-Scheduled-For": utc_key(context.scheduled_for),
            "X-Attempt": str(context.attempt),
            "User-Agent": "scheduler-webhook/1",
        },
    )
    try:
        with _opener.open(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        _raise_for_status(exc)
    except TimeoutError as exc:
        raise TransientError(f"POST {url} timed out after {timeout:.1f}s") from exc
    except urllib.error.URLError as exc:
        # Connection refused, DNS failure, TLS handshake, or a timeout wrapped by urllib: all may pass.
        raise TransientError(f"POST {url} failed: {exc.reason}") from exc
    except OSError as exc:
        # Connection reset or closed mid-response.
        raise TransientError(f"POST {url} failed: {exc}") from exc
    if not 200 <= status < 300:
        raise PermanentError(f"POST {url} answered {status}")
    logger.info(
        "webhook %s answered %d for occurrence %s",
        url,
        status,
        context.occurrence_id,
        extra={"action": "webhook", "occurrence_id": str(context.occurrence_id)},
    )


def _target(url: Any) -> str:
    if not isinstance(url, str) or not url:
        raise PermanentError("payload.url is required")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PermanentError(f"payload.url must be an http or https URL, got {url[:200]!r}")
    return url


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise PermanentError(f"payload.timeout_seconds must be a positive number, got {value!r}")
    return min(float(value), MAX_TIMEOUT_SECONDS)


def _raise_for_status(exc: urllib.error.HTTPError) -> None:
    status = exc.code
    try:
        detail = exc.read(ERROR_BODY_BYTES).decode(errors="replace")
    except OSError:
        detail = ""
    finally:
        exc.close()
    message = f"POST {exc.url} answered {status}: {detail}".strip()
    if status >= 500 or status in RETRYABLE_4XX:
        raise TransientError(message, retry_after=_retry_after(exc.headers.get("Retry-After"))) from None
    raise PermanentError(message) from None


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds; the HTTP-date form is ignored (the backoff still applies)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
