"""Which addresses a tenant's webhook may reach: the public internet only (server-side request forgery).

An IPv6 address can carry an IPv4 address inside it, and a network that translates between the two (NAT64/DNS64,
6to4 relays, Teredo, SIIT) delivers to the embedded one: `64:ff9b::7f00:1` is 127.0.0.1 behind NAT64. So an IPv6
address is judged by every IPv4 address it embeds as well as by itself.
"""

from __future__ import annotations

import ipaddress

__all__ = ["refused_address"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Prefixes whose last 32 bits are an IPv4 address a translator delivers to.
_EMBEDDING_PREFIXES = (
    ipaddress.IPv6Network("64:ff9b::/96"),  # NAT64, the well-known prefix (RFC 6052)
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # NAT64, local-use prefixes (RFC 8215)
    ipaddress.IPv6Network("::ffff:0:0/96"),  # IPv4-mapped
    ipaddress.IPv6Network("::ffff:0:0:0/96"),  # IPv4-translated (SIIT, RFC 2765)
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible (deprecated, RFC 4291)
)
# Deprecated site-local addresses (RFC 3879): private by intent, not flagged by the standard library.
_SITE_LOCAL = ipaddress.IPv6Network("fec0::/10")


def refused_address(address: str) -> bool:
    """Loopback, private, link-local (169.254.169.254 and friends), shared, multicast, reserved or site-local, or an
    IPv6 address that embeds such an IPv4 address: not the public internet a tenant may address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return any(_not_public(candidate) for candidate in (ip, *_embedded_ipv4(ip)))


def _not_public(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip in _SITE_LOCAL:
        return True
    return not ip.is_global or ip.is_multicast


def _embedded_ipv4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    embedded = []
    if ip.sixtofour is not None:  # 2002:AABB:CCDD::/48 is 6to4 for AA.BB.CC.DD
        embedded.append(ip.sixtofour)
    if ip.teredo is not None:  # 2001:0::/32: the server's address, and the client's (stored inverted)
        embedded.extend(ip.teredo)
    if any(ip in prefix for prefix in _EMBEDDING_PREFIXES) and ip not in (
        ipaddress.IPv6Address("::"),
        ipaddress.IPv6Address("::1"),
    ):
        embedded.append(ipaddress.IPv4Address(ip.packed[-4:]))
    return embedded
