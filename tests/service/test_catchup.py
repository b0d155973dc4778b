"""A restarted replica's catch-up (--replicas 2 with --peers), in process: the Snapshot RPC and the hold.

Real servers on free ports; the partner that is down at first is a port
nothing listens on until the test starts an acker there.
"""

from __future__ import annotations

import socket
import threading

import grpc
import pytest
from acker_client import ClusterClient
from acker_protocol.v1 import acker_pb2

from acker_service.batch import Batch, WrongShard
from acker_service.config import ConfigError, ServerConfig
from acker_service.handoff import MovedEntries
from acker_service.moving.catchup import CATCHING_UP, CAUGHT_UP, OFF
from acker_service.moving.layout import ApplyHeld
from acker_service.moving.transfers import balance_of, describe_balance
from acker_service.shard import Shard
from tests.client.polling import wait_until
from tests.ledger.driver import request_of

INIT, ACK = 1, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _apply(stub, kinds, roots, values, keys=(), spout="s") -> acker_pb2.ApplyResponse:
    request = acker_pb2.ApplyRequest.FromString(
        request_of(Batch.of(kinds, roots, values, dedup_keys=list(keys) or (), spouts=[spout]))
    )
    return stub.Apply(request, timeout=5)


def _pending(server) -> set[int]:
    return set(server.call(lambda: [int(r) for r in server.ledger.pending_roots()]))


def _copy(stub, shard_count: int, range_index: int) -> list[acker_pb2.SnapshotChunk]:
    return list(stub.Snapshot(acker_pb2.SnapshotRequest(shard_count=shard_count, range=range_index), timeout=5))


def test_snapshot_copies_one_range_and_removes_nothing(make_server, connect):
    """Shard 1 of 3 keeps ranges 1 and 0: a copy of range 1 has its trees, with their keys; the acker keeps them."""
    server = make_server(shard_index=1, shard_count=3, replicas=2)
    stub = connect(server)
    _apply(stub, [INIT, INIT, INIT], [4, 7, 3], [9, 9, 9])  # 4 and 7 in range 1, 3 in range 0
    _apply(stub, [ACK], [4], [1], keys=[55])
    (chunk,) = _copy(stub, 3, 1)
    assert chunk.last and not chunk.lost
    assert sorted(chunk.entries.root_ids) == [4, 7]
    assert list(chunk.entries.dedup_keys) == [55]
    assert _pending(server) == {3, 4, 7}
    assert connect(server).Describe(acker_pb2.DescribeRequest()).catchup_state == OFF


@pytest.mark.parametrize(
    ("overrides", "shard_count", "range_index", "code", "words"),
    [
        ({"replicas": 2}, 4, 1, grpc.StatusCode.INVALID_ARGUMENT, "this cluster has 3 shards"),
        ({"replicas": 2}, 3, 3, grpc.StatusCode.INVALID_ARGUMENT, "ranges 0..2"),
        ({"replicas": 2}, 3, 2, grpc.StatusCode.FAILED_PRECONDITION, "keeps ranges 1 and 0, not 2"),
        ({"replicas": 1}, 3, 1, grpc.StatusCode.FAILED_PRECONDITION, "--replicas 1"),
    ],
)
def test_snapshot_refuses_what_this_acker_cannot_copy(
    make_server, connect, overrides, shard_count, range_index, code, words
):
    """A wrong shard count, a range outside the cluster or not kept here, or one replica: refused, nothing changes."""
    server = make_server(shard_index=1, shard_count=3, **overrides)
    stub = connect(server)
    _apply(stub, [INIT], [4], [9])
    with pytest.raises(grpc.RpcError) as caught:
        _copy(stub, shard_count, range_index)
    assert caught.value.code() == code
    assert words in caught.value.details()
    assert _pending(server) == {4}


def test_peers_are_checked_at_start():
    """One address per shard, only with two replicas, and a token only over TLS."""
    with pytest.raises(ConfigError, match="one address per shard"):
        ServerConfig(shard_count=3, replicas=2, peers="a:1,b:2")
    with pytest.raises(ConfigError, match="--peers is for --replicas 2"):
        ServerConfig(shard_count=2, replicas=1, peers="a:1,b:2")
    with pytest.raises(ConfigError, match="not host:port"):
        ServerConfig(shard_count=2, replicas=2, peers="a:1,b")
    assert ServerConfig(shard_count=2, replicas=2, peers="a:1, b:2").peer_addresses == ("a:1", "b:2")
    with pytest.raises(ConfigError, match="--peer-token-file needs --tls-cert"):
        ServerConfig(shard_count=2, replicas=2, peers="a:1,b:2", peer_token_file=__file__)


def test_the_shard_holds_each_request_until_its_range_is_installed():
    """Held requests are validated at once, applied after their range's copy, and what the copy has is recognised."""
    config = ServerConfig(shard_index=1, shard_count=3, replicas=2, peers="a:1,b:2,c:3")
    shard = Shard(config)
    assert shard.membership.catchup.state == CATCHING_UP and shard.membership.catchup.waiting == {1: 2, 0: 0}
    shard.apply_request(request_of(Batch.of([ACK], [4], [1], dedup_keys=[55], spouts=["s"])))
    shard.apply_request(request_of(Batch.of([INIT, ACK], [3, 3], [5, 5], dedup_keys=[0, 66], spouts=["s"])))
    with pytest.raises(WrongShard, match="this acker is shard 1"):  # refused now, not held: shards 2 and 0 keep 5
        shard.apply_request(request_of(Batch.of([INIT], [5], [1], spouts=["s"])))
    assert shard.pending_trees == 0 and (
        shard.membership.catchup.held.requests,
        shard.membership.catchup.held.operations,
    ) == (2, 3)
    # The partner of range 1 applied the init of 4 and the ack keyed 55 before its copy.
    partner = Shard(ServerConfig(shard_index=2, shard_count=3, replicas=2))
    partner.apply_request(request_of(Batch.of([INIT, ACK], [4, 4], [3, 1], dedup_keys=[0, 55], spouts=["s"])))
    assert not shard.membership.install_snapshot(1, partner.membership.snapshot(3, 1))
    assert shard.ledger.pending_roots() == [4], "range 1's copy and its held ack applied; root 3 waits for range 0"
    assert shard.ledger.stats.deduplicated == 1
    assert shard.membership.install_snapshot(0, None)  # range 0's partner lost it too: nothing to copy
    assert shard.membership.catchup.state == CAUGHT_UP and not shard.membership.catchup.held.requests
    # Root 4: the held ack keyed 55 was in the copy (not applied twice: 3 ^ 1 stays pending). Root 3: acked.
    assert shard.ledger.pending_roots() == [4]
    assert shard.ledger.stats.deduplicated == 1
    assert (shard.membership.catchup.copied_entries, shard.membership.catchup.lost_ranges) == (1, 1)
    assert shard.membership.install_snapshot(1, None)  # a late copy is ignored
    assert shard.ledger.pending_roots() == [4]


def _catching_up(**overrides) -> Shard:
    """Shard 1 of 3, restarted with two replicas and peers: ranges 1 (partner shard 2) and 0 (shard 0) awaited."""
    return Shard(ServerConfig(shard_index=1, shard_count=3, replicas=2, peers="a:1,b:2,c:3", **overrides))


def _request(kinds, roots, values, keys=()) -> bytes:
    return request_of(Batch.of(kinds, roots, values, dedup_keys=list(keys) or (), spouts=["s"]))


def test_a_range_already_copied_applies_at_once_while_the_other_still_holds():
    """Range 0 installed, range 1 not: an operation on range 0 applies now, one on range 1 is held for its copy."""
    shard = _catching_up()
    assert not shard.membership.install_snapshot(0, None)
    now = shard.apply_request(_request([INIT], [3], [9]))
    assert (now.applied, now.held) == (1, 0) and shard.ledger.pending_roots() == [3]
    later = shard.apply_request(_request([INIT], [4], [9]))
    assert (later.applied, later.held) == (0, 1) and shard.ledger.pending_roots() == [3]
    assert shard.membership.install_snapshot(1, None)
    assert sorted(shard.ledger.pending_roots()) == [3, 4]


def test_held_operations_of_a_range_apply_in_arrival_order_once_it_is_installed():
    """A request mixing both ranges is split: its range-0 part applies with range 0's copy, its range-1 part waits,
    and range 1's held parts apply in arrival order (the first init of root 4 wins, so its ack ends the tree)."""
    shard = _catching_up()
    mixed = shard.apply_request(_request([INIT, INIT], [3, 4], [9, 5]))
    shard.apply_request(_request([INIT], [4], [6]))  # set-once: ignored if it comes after the first init
    shard.apply_request(_request([ACK], [4], [5], keys=[71]))
    assert (mixed.applied, mixed.held) == (0, 2) and shard.membership.catchup.held.operations == 4
    assert not shard.membership.install_snapshot(0, None)
    assert shard.ledger.pending_roots() == [3], "range 0's part applied, range 1's parts still held"
    assert shard.membership.catchup.held.operations == 3
    assert shard.membership.install_snapshot(1, None)
    assert shard.ledger.pending_roots() == [3], "root 4: init 5, init 6 ignored, ack 5: acked"
    assert (shard.ledger.stats.acked, shard.ledger.stats.duplicate_inits) == (1, 1)


def test_past_the_bound_a_request_is_refused_whole_and_changes_nothing():
    """At --max-held-operations a request that would be held is refused (ApplyHeld: UNAVAILABLE), nothing applied
    or held, the refusal counted; an operation on a copied range still applies, and after the copy all is taken."""
    shard = _catching_up(max_held_operations=2)
    assert not shard.membership.install_snapshot(0, None)
    shard.apply_request(_request([INIT, ACK], [4, 4], [5, 1], keys=[0, 8]))
    with pytest.raises(ApplyHeld, match=r"--max-held-operations 2\).*nothing was applied, retry"):
        shard.apply_request(_request([INIT, INIT], [3, 7], [9, 9]))  # root 3 could apply, root 7 must be held
    assert shard.ledger.pending_roots() == [] and shard.membership.catchup.held.operations == 2
    assert shard.metrics.sample("acker_catchup_refused_total") == 1
    assert shard.metrics.sample("acker_catchup_held_operations") == 2
    assert shard.apply_request(_request([INIT], [3], [9])).applied == 1, "range 0 is copied: no hold, no bound"
    assert shard.membership.install_snapshot(1, None)
    again = shard.apply_request(_request([INIT, INIT], [3, 7], [9, 9]))
    assert (again.held, sorted(shard.ledger.pending_roots())) == (0, [3, 4, 7])


def test_the_bound_answers_unavailable_over_grpc_until_the_copy_arrives(make_server, connect):
    """Shard 2 (range 1's partner) is down: past the bound Apply fails UNAVAILABLE with the flag to raise, nothing
    changes; once shard 2 is up and range 1 copied, the same request is applied."""
    shard0 = make_server(shard_index=0, shard_count=3, replicas=2)
    port2 = _free_port()
    peers = f"{shard0.address},127.0.0.1:{_free_port()},127.0.0.1:{port2}"
    restarted = make_server(
        shard_index=1, shard_count=3, replicas=2, peers=peers, catchup_delay=0.0, max_held_operations=1
    )
    stub = connect(restarted)
    assert _apply(stub, [INIT], [7], [9]).held == 1
    with pytest.raises(grpc.RpcError) as caught:
        _apply(stub, [INIT], [4], [9])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "--max-held-operations 1" in caught.value.details()
    assert restarted.shard.metrics.sample("acker_catchup_refused_total") == 1
    wait_until(lambda: 0 not in restarted.call(lambda: dict(restarted.shard.membership.catchup.waiting)), timeout=60)
    assert _apply(stub, [INIT], [3], [9]).applied == 1, "range 0 is copied: applied while range 1 still waits"
    assert _pending(restarted) == {3}
    make_server(shard_index=2, shard_count=3, replicas=2, port=port2)
    wait_until(lambda: stub.Describe(acker_pb2.DescribeRequest()).catchup_state == CAUGHT_UP, timeout=60)
    assert _apply(stub, [INIT], [4], [9]).applied == 1
    assert _pending(restarted) == {3, 4, 7}


def test_a_restarted_acker_holds_apply_until_its_down_partner_answers(make_server, connect):
    """Shard 1 restarts while shard 2 is down: Apply is answered and held, Describe says catching up; once shard 2
    is back, both ranges are copied, the held operations applied, and Describe says caught up."""
    shard0 = make_server(shard_index=0, shard_count=3, replicas=2)
    port2 = _free_port()
    peers = f"{shard0.address},127.0.0.1:{_free_port()},127.0.0.1:{port2}"
    _apply(connect(shard0), [INIT], [3], [9])  # range 0: shards 0 and 1
    restarted = make_server(shard_index=1, shard_count=3, replicas=2, peers=peers, catchup_delay=0.0)
    stub = connect(restarted)
    _apply(stub, [INIT], [3], [9])  # its own copy of root 3's init (also in shard 0's snapshot)
    _apply(stub, [INIT], [7], [9])  # range 1: shards 1 and 2
    # Range 0 is copied (shard 0 is up) and its held init applied; range 1 waits for shard 2, its request held.
    wait_until(lambda: stub.Describe(acker_pb2.DescribeRequest()).catchup_entries == 1, timeout=60)
    assert stub.Describe(acker_pb2.DescribeRequest()).catchup_state == CATCHING_UP
    assert _pending(restarted) == {3}
    assert restarted.shard.metrics.sample("acker_catchup_held_requests") == 1
    shard2 = make_server(shard_index=2, shard_count=3, replicas=2, port=port2)
    _apply(connect(shard2), [INIT], [4], [9])  # range 1, applied at the partner only
    wait_until(lambda: stub.Describe(acker_pb2.DescribeRequest()).catchup_state == CAUGHT_UP, timeout=60)
    assert _pending(restarted) == {3, 4, 7}
    info = stub.Describe(acker_pb2.DescribeRequest())
    assert info.catchup_entries == 2  # root 3 from shard 0, root 4 from shard 2
    assert restarted.shard.metrics.sample("acker_catchup_state") == 0
    assert restarted.shard.metrics.sample("acker_catchup_entries_total") == 2


def test_partners_unreachable_for_the_message_timeout_count_as_lost(make_server, connect):
    """Both partners stay down: after the message timeout each range counts as lost there too, and the held
    requests are applied (those trees' other copies are gone; the spouts' backstop has replayed them)."""
    peers = f"127.0.0.1:{_free_port()},127.0.0.1:{_free_port()},127.0.0.1:{_free_port()}"
    restarted = make_server(
        shard_index=1, shard_count=3, replicas=2, peers=peers, catchup_delay=0.0, message_timeout=0.5
    )
    stub = connect(restarted)
    _apply(stub, [INIT], [7], [9])
    wait_until(lambda: stub.Describe(acker_pb2.DescribeRequest()).catchup_state == CAUGHT_UP, timeout=60)
    assert restarted.shard.metrics.sample("acker_catchup_lost_ranges_total") == 2
    assert restarted.call(lambda: restarted.shard.ledger.stats.inits) == 1, "the held init was not applied"


def test_a_large_copy_streams_in_chunks_that_add_up(monkeypatch):
    """Chunks of at most ENTRIES_PER_MESSAGE entries, only the last one marked, read back as the whole copy."""
    from acker_service.moving import catchup_peer
    from acker_service.moving.reshard import from_request

    monkeypatch.setattr(catchup_peer, "ENTRIES_PER_MESSAGE", 2)
    partner = Shard(ServerConfig(shard_index=0, shard_count=1))
    partner.apply_request(request_of(Batch.of([INIT] * 5, [1, 2, 3, 4, 5], [9] * 5, spouts=["s"])))
    partner.apply_request(request_of(Batch.of([ACK], [3], [1], dedup_keys=[77], spouts=["s"])))
    moved = partner.ledger.export_snapshot(1, 0)
    chunks = list(catchup_peer.snapshot_chunks(moved, 42))
    assert [len(c.entries.root_ids) for c in chunks] == [2, 2, 1]
    assert [c.last for c in chunks] == [False, False, True] and {c.incarnation for c in chunks} == {42}
    whole = MovedEntries.concat([from_request(c.entries) for c in chunks])
    assert whole.rows() == moved.rows()
    (lost,) = catchup_peer.snapshot_chunks(None, 42)
    assert lost.lost and lost.last


def test_the_client_sends_a_refused_batch_again_until_the_copy_lets_it_in(make_server, connect):
    """The real client retries the bound's UNAVAILABLE (nothing dropped): its init of root 4 is refused while range
    1's partner is down and applied once that partner is up and range 1 copied."""
    shard0 = make_server(shard_index=0, shard_count=3, replicas=2)
    port2 = _free_port()
    restarted = make_server(
        shard_index=1,
        shard_count=3,
        replicas=2,
        peers=f"{shard0.address},127.0.0.1:{_free_port()},127.0.0.1:{port2}",
        catchup_delay=0.0,
        max_held_operations=1,
    )
    assert _apply(connect(restarted), [INIT], [7], [9]).held == 1  # the bound is full until range 1 is copied
    addresses = [shard0.address, restarted.address, f"127.0.0.1:{port2}"]
    # One replica on the client's side: root 4 goes to shard 1 only, so only the retry can bring it there.
    with ClusterClient(addresses, replicas=1, verify=False, wait_for_shard=60.0) as client:
        client.init(4, 9, "s")
        flushed: list[BaseException | None] = []

        def flush() -> None:
            try:
                client.flush()
                flushed.append(None)
            except BaseException as exc:  # reported to the test thread
                flushed.append(exc)

        sender = threading.Thread(target=flush)
        sender.start()
        wait_until(lambda: restarted.shard.metrics.sample("acker_catchup_refused_total") >= 1, timeout=60)
        assert _pending(restarted) == set()
        make_server(shard_index=2, shard_count=3, replicas=2, port=port2)
        sender.join(timeout=90)
        assert flushed == [None]
        assert client.stats.operations_dropped == 0 and client.stats.batches_retried >= 1
    assert _pending(restarted) == {4, 7}


def test_a_copy_refused_at_the_bound_after_the_partners_cut_is_not_skipped(make_server, connect):
    """The copy-refusal case (the simulation's ``bound-skip``): the partner's copy is cut, then a batch is refused at
    the restarted acker's bound while the partner applies its other copy. The client must retry the refused copy,
    not skip it as for an unreachable replica: skipped, the restarted acker never gets that init."""
    shard0 = make_server(shard_index=0, shard_count=3, replicas=2)
    shard2 = make_server(shard_index=2, shard_count=3, replicas=2)
    restarted = make_server(
        shard_index=1,
        shard_count=3,
        replicas=2,
        peers=f"{shard0.address},127.0.0.1:{_free_port()},{shard2.address}",
        catchup_delay=600.0,  # the test installs the copies itself, at the moments it chooses
        max_held_operations=1,
    )
    assert _apply(connect(restarted), [INIT], [7], [9]).held == 1  # the bound is full until range 1 is copied
    cut = shard2.call(
        lambda: shard2.shard.membership.snapshot(3, 1)
    )  # the partner's cut of range 1: before root 4 exists
    with ClusterClient(
        [shard0.address, restarted.address, shard2.address], replicas=2, verify=False, wait_for_shard=60.0
    ) as client:
        client.init(4, 9, "s")  # range 1: shard 1 (refused at its bound) and shard 2 (applies it after its cut)
        flushed: list[BaseException | None] = []

        def flush() -> None:
            try:
                client.flush()
                flushed.append(None)
            except BaseException as exc:  # reported to the test thread
                flushed.append(exc)

        sender = threading.Thread(target=flush)
        sender.start()
        wait_until(lambda: restarted.shard.metrics.sample("acker_catchup_refused_total") >= 1, timeout=60)
        wait_until(lambda: _pending(shard2) == {4}, timeout=60)
        wait_until(lambda: restarted.shard.metrics.sample("acker_catchup_refused_total") >= 2 or flushed, timeout=60)
        copy0 = shard0.call(lambda: shard0.shard.membership.snapshot(3, 0))
        restarted.call(lambda: restarted.shard.membership.install_snapshot(0, copy0))
        assert restarted.call(lambda: restarted.shard.membership.install_snapshot(1, cut)), "caught up"
        sender.join(timeout=90)
        assert flushed == [None]
        dropped = client.stats.operations_dropped
    assert _pending(restarted) == {4, 7}, "the copy refused at the bound was skipped: the restarted acker missed it"
    assert dropped == 0


def test_the_restarted_ackers_counters_add_up_with_the_trees_copied_in(make_server, connect):
    """Conservation per acker lifetime: a restarted replica counts the trees its partner copied to it (Describe and
    metrics agree), the partner counts the copies it gave, which stay with it."""
    partner = make_server(shard_index=0, shard_count=2, replicas=2)
    _apply(connect(partner), [INIT, INIT, INIT], [2, 4, 3], [9, 9, 9])  # ranges 0 and 1: shard 0 keeps both
    restarted = make_server(
        shard_index=1,
        shard_count=2,
        replicas=2,
        peers=f"{partner.address},127.0.0.1:{_free_port()}",
        catchup_delay=0.0,
    )
    stub = connect(restarted)
    wait_until(lambda: stub.Describe(acker_pb2.DescribeRequest()).catchup_state == CAUGHT_UP, timeout=60)
    _apply(stub, [ACK], [3], [9], keys=[77])  # one copied tree ends here: an outcome for a tree never initialised here
    described = describe_balance(stub.Describe(acker_pb2.DescribeRequest()))
    assert (described.inits, described.copied_in, described.acked, described.pending) == (0, 3, 1, 2)
    assert described.holds, str(described)
    samples = (
        (s.name, s.labels, s.value) for family in restarted.shard.metrics.registry.collect() for s in family.samples
    )
    assert balance_of(samples) == described
    given = connect(partner).Describe(acker_pb2.DescribeRequest())
    assert given.tree_counts.trees_copied_out_snapshot == 3 and given.pending_trees == 3
    assert describe_balance(given).holds
