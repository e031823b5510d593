"""The webhook's address rule (dispatch/handlers/addresses.py): the public internet only, including the IPv4 address
an IPv6 form embeds, which a translator (NAT64, 6to4, Teredo, SIIT) would deliver to."""

from __future__ import annotations

import pytest

from dispatch.handlers.addresses import refused_address


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "169.254.169.254",
        "100.64.0.1",  # shared address space
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "::",
        "fe80::1%eth0",
        "fc00::1",
        "::ffff:127.0.0.1",
        # Each embeds 127.0.0.1 or a private address, and each passed the old rule:
        "64:ff9b::7f00:1",  # NAT64 (RFC 6052)
        "64:ff9b::a01:203",  # NAT64 of 10.1.2.3
        "64:ff9b:1::7f00:1",  # NAT64 local-use prefix (RFC 8215)
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "::7f00:1",  # IPv4-compatible
        "::ffff:0:7f00:1",  # IPv4-translated (SIIT)
        "fec0::1",  # site-local
        "fed0::1",
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo whose client is 127.0.0.1 (inverted)
    ],
)
def test_every_non_public_address_and_every_form_embedding_one_is_refused(address):
    assert refused_address(address)


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "8.8.8.8",
        "2606:4700:4700::1111",
        "64:ff9b::808:808",  # NAT64 of 8.8.8.8
        "2002:808:808::1",  # 6to4 of 8.8.8.8
    ],
)
def test_public_addresses_and_forms_embedding_public_ones_are_allowed(address):
    assert not refused_address(address)
