"""The client address of a request: REMOTE_ADDR unless the operator declares proxies that write X-Forwarded-For."""

from __future__ import annotations

import pytest
from django.test import RequestFactory, override_settings

from scheduler_project.client_address import address_bucket, client_address


def request_from(remote: str, forwarded: str | None = None):
    extra = {"REMOTE_ADDR": remote}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return RequestFactory().get("/", **extra)


def test_without_trusted_proxies_the_forwarded_header_is_ignored():
    assert client_address(request_from("192.0.2.1", "203.0.113.9")) == "192.0.2.1"


@override_settings(SCHEDULER_NUM_PROXIES=2)
@pytest.mark.parametrize(
    ("forwarded", "client"),
    [
        ("198.51.100.5, 203.0.113.1", "198.51.100.5"),
        ("10.9.9.9, 198.51.100.5, 203.0.113.1", "198.51.100.5"),  # the leftmost entry is the client's own claim
        ("198.51.100.5", "198.51.100.5"),
        ("not-an-address, 203.0.113.1", "192.0.2.1"),
        ("", "192.0.2.1"),
    ],
)
def test_behind_trusted_proxies_the_address_the_outermost_saw_is_the_client(forwarded, client):
    assert client_address(request_from("192.0.2.1", forwarded)) == client


@pytest.mark.parametrize(
    ("address", "bucket"),
    [
        ("192.0.2.1", "192.0.2.1"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::1", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
        ("", "unknown"),
    ],
)
def test_a_client_is_counted_per_ipv4_address_or_ipv6_64_network(address, bucket):
    assert address_bucket(address) == bucket
