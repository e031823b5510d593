"""The address a request came from, trusting X-Forwarded-For only as far as the operator says proxies write it."""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def client_address(request: HttpRequest) -> str:
    """REMOTE_ADDR; behind SCHEDULER_NUM_PROXIES reverse proxies, the address the outermost of them saw.

    Every proxy appends the address it received the request from to X-Forwarded-For, so only the last N entries
    were written by the deployment's own proxies; anything to their left is whatever the client chose to send.
    With no proxies configured the header is ignored: otherwise anyone could pick a fresh address per request
    and walk past the per-address API throttle and the admin login lockout. An entry that is not an address
    (a misconfigured proxy) falls back to REMOTE_ADDR rather than becoming a key of its own.
    """
    remote = request.META.get("REMOTE_ADDR") or ""
    proxies = settings.SCHEDULER_NUM_PROXIES
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR") or ""
    if proxies <= 0 or not forwarded.strip():
        return remote
    entries = [entry.strip() for entry in forwarded.split(",")]
    candidate = entries[-min(proxies, len(entries))]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return remote


def address_bucket(address: str) -> str:
    """The unit one client is counted in: an IPv4 address, or the /64 network of an IPv6 one.

    One IPv6 subscriber is handed a whole /64, so counting single addresses would give a client 2**64 budgets.
    """
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address or "unknown"
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{parsed}/64", strict=False))
    return str(parsed)
