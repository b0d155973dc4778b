"""ClusterClient against real acker servers: verification, routing, folding, errors, flush semantics."""

from __future__ import annotations

import threading

import grpc
import pytest
from acker_client import AckerError, ClusterClient, ClusterMisconfigured, RequestRefused, ShardUnavailable, new_id

from .polling import wait_until


def test_refuses_wrong_address_order(make_ackers):
    """A list with two shards swapped is refused with a message naming the position and the shard."""
    servers = make_ackers(3)
    addresses = [servers[1].address, servers[0].address, servers[2].address]
    with pytest.raises(ClusterMisconfigured, match=r"address 0 .* is acker shard 1 of 3"):
        ClusterClient(addresses)


def test_refuses_incomplete_address_list(make_ackers):
    """Listing 2 of 3 shards is refused: roots would be routed with the wrong modulus."""
    servers = make_ackers(3)
    with pytest.raises(ClusterMisconfigured, match="shard 0 of 3"):
        ClusterClient([s.address for s in servers[:2]])


def test_unreachable_acker_at_start_is_shard_unavailable(make_ackers):
    """Verification against a stopped acker names the shard and its address."""
    servers = make_ackers(2)
    servers[1].stop(0)
    with pytest.raises(ShardUnavailable) as info:
        ClusterClient([s.address for s in servers], deadline=5.0)
    assert info.value.shards == (1,) and info.value.addresses == (servers[1].address,)


def test_routes_roots_by_modulo(make_ackers, make_client):
    """Each root's init lands on shard root % 3 (the ackers' pending counts match), none is refused."""
    servers = make_ackers(3, message_timeout=60.0)
    client = make_client([s.address for s in servers])
    roots = [new_id() for _ in range(300)]
    for root in roots:
        client.init(root, new_id(), "routing")
    client.flush()
    expected = [sum(1 for r in roots if r % 3 == i) for i in range(3)]
    assert [client.describe(i).pending_trees for i in range(3)] == expected
    assert client.shard_of(roots[0]) == roots[0] % 3
    assert client.stats.applied == 300 and client.stats.batches_failed == 0


def test_many_acks_for_one_root_are_one_operation(make_ackers, make_client):
    """1,000 acks for one root in one batch are sent as one operation; the server applies exactly one."""
    (server,) = make_ackers(1, message_timeout=60.0)
    client = make_client([server.address], batch_size=4096, flush_interval=60.0, send_when_idle=False)
    root = new_id()
    for _ in range(1000):
        client.ack(root, new_id())
    client.flush()
    stats = client.stats
    assert (stats.calls, stats.batches_sent, stats.operations_sent, stats.applied) == (1000, 1, 1, 1)
    assert stats.operations_folded == 999


def test_batches_are_sent_at_batch_size(make_ackers, make_client):
    """With a long flush interval, a batch goes out as soon as it holds batch_size operations."""
    (server,) = make_ackers(1, message_timeout=60.0)
    client = make_client([server.address], batch_size=10, flush_interval=60.0, send_when_idle=False)
    for _ in range(25):
        client.init(new_id(), 1, "sized")
    assert client.stats.batches_sent == 2 and client.stats.operations_sent == 20
    client.flush()
    assert client.stats.operations_sent == 25


def test_background_flush_sends_by_age(make_ackers, make_client):
    """With send_when_idle=False a lone operation is sent by the background flusher once it is flush_interval old."""
    (server,) = make_ackers(1, message_timeout=60.0)
    client = make_client([server.address], flush_interval=0.01, send_when_idle=False)
    client.init(new_id(), 1, "aged")
    wait_until(lambda: client.stats.operations_sent == 1)
    assert server.ledger is not None and client.describe(0).pending_trees == 1


def test_down_shard_is_given_up_after_wait_for_shard(make_ackers, make_client):
    """Ops for a stopped shard wait wait_for_shard, then raise ShardUnavailable naming it; the healthy shard applies."""
    servers = make_ackers(2, message_timeout=60.0)
    client = make_client([s.address for s in servers], flush_interval=60.0, send_when_idle=False, wait_for_shard=0.5)
    servers[1].stop(0)
    roots = [new_id() for _ in range(40)]
    for root in roots:
        client.init(root, 1, "down")
    with pytest.raises(ShardUnavailable) as info:
        client.flush()
    err = info.value
    assert err.shards == (1,) and servers[1].address in str(err)
    assert set(err.init_roots) == {r for r in roots if r % 2 == 1}
    # The batch waited for a connection (wait_for_ready) until its budget ran out.
    assert err.failures[0].code == grpc.StatusCode.DEADLINE_EXCEEDED and err.failures[0].reason == "timeout"
    assert client.describe(0).pending_trees == sum(1 for r in roots if r % 2 == 0)
    stats = client.stats
    assert stats.operations_dropped == len(err.init_roots) == stats.dropped_by_reason["timeout"]
    assert stats.operations_waiting == 0 and stats.shard_states == ("READY", "UNREACHABLE")
    client.flush()  # the dropped batch is gone: nothing is left to send


def test_background_errors_reach_on_error(make_ackers, make_client):
    """A failed age-based flush is counted and passed to on_error with the failed shard."""
    servers = make_ackers(1)
    errors: list[AckerError] = []
    got = threading.Event()
    # wait_for_shard 1 s: the stopped shard's batch is given up (and reported) after 1 s, not the default 20 s.
    client = make_client(
        [servers[0].address], flush_interval=0.01, wait_for_shard=1.0, on_error=lambda e: (errors.append(e), got.set())
    )
    servers[0].stop(0)
    client.ack(new_id(), 5)
    assert got.wait(30)
    assert isinstance(errors[0], ShardUnavailable) and errors[0].shards == (0,)
    assert client.stats.background_errors == 1


def test_refused_request_is_request_refused(make_ackers, make_client):
    """A batch the acker refuses (a root of another shard) surfaces as RequestRefused with the acker's message."""
    servers = make_ackers(2)
    # Unverified client with the order swapped: the acker refuses roots it does not own.
    client = make_client(
        [servers[1].address, servers[0].address], verify=False, flush_interval=60.0, send_when_idle=False
    )
    client.init(2, 1, "wrong")  # 2 % 2 == 0 -> sent to position 0, which is shard 1
    with pytest.raises(RequestRefused, match="belongs to shard 0"):
        client.flush()


def test_bad_ids_refused_locally(make_ackers, make_client):
    """A zero root or oversize value raises ValueError before it can poison a shared batch."""
    (server,) = make_ackers(1)
    client = make_client([server.address])
    for call in (
        lambda: client.ack(0, 1),
        lambda: client.ack(1 << 64, 1),
        lambda: client.init(5, -1, "s"),
        lambda: client.init(5, 1, ""),
        lambda: client.ack(5, 1, dedup_key=-2),
    ):
        with pytest.raises(ValueError):
            call()
    assert client.stats.calls == 0


def test_closed_client_refuses_calls(make_ackers):
    """After close(), buffered ops were flushed and further calls raise AckerError."""
    (server,) = make_ackers(1, message_timeout=60.0)
    client = ClusterClient([server.address], flush_interval=60.0, send_when_idle=False)
    client.init(new_id(), 1, "closing")
    client.close()
    with ClusterClient([server.address]) as other:
        assert other.describe(0).pending_trees == 1
    with pytest.raises(AckerError):
        client.ack(new_id(), 1)


def test_concurrent_callers_lose_nothing(make_ackers, make_client):
    """8 threads buffering and flushing concurrently: every init is applied exactly once."""
    servers = make_ackers(2, message_timeout=60.0)
    client = make_client([s.address for s in servers], batch_size=64)

    def work():
        for i in range(500):
            client.init(new_id(), 1, "threads")
            if i % 100 == 0:
                client.flush()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.flush()
    assert client.stats.applied == 4000
    assert sum(client.describe(i).pending_trees for i in range(2)) == 4000


def test_shared_client_is_one_per_cluster_per_process():
    """shared_client returns the same client for the same address list until close_shared_clients closes it."""
    from acker_client import close_shared_clients, shared_client

    addresses = ["127.0.0.1:1", "127.0.0.1:2"]
    first = shared_client(addresses, verify=False)
    assert shared_client(tuple(addresses)) is first
    assert shared_client(addresses[:1], verify=False) is not first
    close_shared_clients()
    with pytest.raises(AckerError, match="closed"):
        first.stats  # noqa: B018 - a closed client refuses to make new channels
    assert shared_client(addresses, verify=False) is not first
    close_shared_clients()
