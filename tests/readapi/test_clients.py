"""Which client an address counts as, for the read endpoint's share of connections per client."""

from __future__ import annotations

import pytest

from rewardflow.boundedhttp import client_of


@pytest.mark.parametrize(("address", "client"), [
    ("10.1.2.3", "10.1.2.3"),
    ("10.1.2.4", "10.1.2.4"),
    ("127.0.0.1", "127.0.0.0/8"),
    ("127.3.2.1", "127.0.0.0/8"),
    ("::1", "127.0.0.0/8"),
    ("::ffff:127.0.0.9", "127.0.0.0/8"),
    ("::ffff:10.0.0.1", "10.0.0.1"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
    ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
    ("fe80::1%eth0", "fe80::1%eth0"),
    ("fe80::2%eth0", "fe80::2%eth0"),
    ("64:ff9b::c000:221", "64:ff9b::/64"),
    ("2002:c000:221::1", "2002:c000:221::/64"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:0:4136:e378::/64"),  # (192.0.2.45 is no global address)
    ("64:ff9b::808:808", "8.8.8.8"),
    ("2002:808:808::1", "8.8.8.8"),
    ("2002:7f00:1::1", "2002:7f00:1::/64"),  # 6to4 of 127.0.0.1: not this host's loopback
    ("not an address", "not an address"),
])
def test_an_address_counts_as_its_client(address: str, client: str) -> None:
    assert client_of(address) == client
