"""Messages a person can act on (issue 12): dead ackers, addresses without a port."""

from __future__ import annotations

import pytest
from acker_client import ClusterClient, ShardUnavailable
from acker_client.cluster import check_address
from acker_client.testing import unreachable_addresses


def test_dead_ackers_are_all_named_and_said_to_be_unreachable() -> None:
    dead = unreachable_addresses(3)
    with pytest.raises(ShardUnavailable) as raised:
        ClusterClient(dead, deadline=2.0)
    message = str(raised.value)
    assert message.startswith("could not connect to 3 of 3 ackers")
    assert all(f"shard {i} ({a})" in message for i, a in enumerate(dead))
    assert "dropped" not in message
    assert raised.value.shards == (0, 1, 2)


@pytest.mark.parametrize("address", ["acker-0", "127.0.0.1", "::1", "host:", "host:port", "host:70000", ""])
def test_an_address_without_a_port_is_refused_at_construction(address: str) -> None:
    with pytest.raises(ValueError, match="port|empty"):
        ClusterClient([address], verify=False)


@pytest.mark.parametrize("address", ["acker-0:7100", "127.0.0.1:7100", "[::1]:7100", "unix:/tmp/acker.sock"])
def test_addresses_with_a_port_are_accepted(address: str) -> None:
    check_address(address)
