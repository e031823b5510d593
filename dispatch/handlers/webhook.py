"""The built-in `webhook` handler: POST the payload as JSON, keyed for the receiver's deduplication.

The receiver gets `Idempotency-Key: <occurrence_id>`, the same on every retry, failover and replay: at-least-once
delivery becomes one business effect only where the receiver deduplicates on it (seed 000).

A tenant chooses the URL, so the handler refuses loopback, private, link-local (cloud metadata) and reserved
addresses unless the operator sets SCHEDULER_WEBHOOK_ALLOW_PRIVATE=1. The check is made on the resolved address, and
the connection goes to exactly that address (the Host header and TLS name stay the URL's), so a DNS answer that
changes between the check and the connect (rebinding) cannot reach an address that was not checked.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import json
import logging
import socket
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

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


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the address that was checked, whatever the host name resolves to now."""

    def __init__(self, *args: Any, pinned_ip: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pinned_ip = pinned_ip

    def connect(self) -> None:
        self.sock = socket.create_connection((self.pinned_ip, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, pinned_ip: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pinned_ip = pinned_ip

    def connect(self) -> None:
        sock = socket.create_connection((self.pinned_ip, self.port), self.timeout)
        # The certificate is checked against the URL's host name, not the address.
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


class _PinnedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, pinned_ip: str) -> None:
        super().__init__()
        self.pinned_ip = pinned_ip

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(functools.partial(_PinnedHTTPConnection, pinned_ip=self.pinned_ip), req)


class _PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, pinned_ip: str) -> None:
        super().__init__()
        self.pinned_ip = pinned_ip

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(functools.partial(_PinnedHTTPSConnection, pinned_ip=self.pinned_ip), req)


def _opener_for(pinned_ip: str) -> urllib.request.OpenerDirector:
    # No proxy from the environment: the connection must go to the checked address itself.
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), _NoRedirects, _PinnedHTTPHandler(pinned_ip), _PinnedHTTPSHandler(pinned_ip)
    )


def _forbidden(address: str) -> bool:
    """Loopback, private, link-local (169.254.169.254 and friends), shared, multicast or reserved: not the public
    internet a tenant may address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


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
        refused = [address for address in addresses if _forbidden(address)]
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
    opener = _opener_for(_checked_address(url))
    try:
        with opener.open(request, timeout=timeout) as response:
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
