"""A move stopped mid-way between its steps: only the roots that change owner wait; every other root is served.

Real in-process ackers on 127.0.0.1 and real gRPC; the test drives the steps
(prepare, cut, commit) one acker at a time, as ``acker-ctl reshard`` would
but with pauses between them, and checks what each acker does with an Apply
meanwhile: a root that does not move applies at once, a root arriving at its
new owner is held (accepted, not applied) until its old owner's handoff is
merged, a root that left is refused by its old owner after the cut.
"""

from __future__ import annotations

import grpc
import pytest
from acker_client import ClusterClient
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from acker_service.config import ServerConfig
from acker_service.handoff import MovedEntries
from acker_service.moving.reshard import to_request
from acker_service.server import AckerServer

INIT, ACK = 1, 2
SPOUT = "moving"


@pytest.fixture
def servers():
    started: list[AckerServer] = []

    def make(index: int, count: int, **settings) -> AckerServer:
        config = ServerConfig(host="127.0.0.1", port=0, grace=0.5, shard_index=index, shard_count=count,
                              message_timeout=30.0, **settings)  # fmt: skip
        server = AckerServer(config)
        server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop(0)


class Acker:
    """One acker over a channel of its own, with the calls the tests need."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = acker_pb2_grpc.AckerStub(self.channel)

    def apply(self, ops: list[tuple[int, int, int]], key: int = 0, epoch: int = 0) -> acker_pb2.ApplyResponse:
        """Apply (kind, root, value) operations; ACKs carry ``key`` + their position as dedup keys; ``epoch``: the
        layout epoch the request names as routed by (a client of a replicated cluster names it)."""
        request = acker_pb2.ApplyRequest(
            kinds=[k for k, _, _ in ops],
            root_ids=[r for _, r, _ in ops],
            values=[v for _, _, v in ops],
            dedup_keys=[key + i if key else 0 for i in range(len(ops))],
            spouts=[SPOUT],
            layout_epoch=epoch,
        )
        return self.stub.Apply(request, timeout=5)

    def counts(self) -> tuple[int, int]:
        """(pending trees, trees acked) of this acker."""
        r = self.stub.Inspect(acker_pb2.InspectRequest(), timeout=5)
        return r.pending_trees, r.trees_acked

    def prepare(self, epoch: int, new: list[str], old: list[str]) -> None:
        index = new.index(self.address) if self.address in new else -1
        before = old.index(self.address) if self.address in old else -1
        layout = acker_pb2.Layout(epoch=epoch, shard_count=len(new), shard_index=index, addresses=new)
        previous = acker_pb2.Layout(epoch=epoch - 1, shard_count=len(old), shard_index=before, addresses=old)
        self.stub.PrepareLayout(acker_pb2.PrepareLayoutRequest(layout=layout, previous=previous), timeout=5)

    def cut(self, epoch: int) -> acker_pb2.CutLayoutResponse:
        return self.stub.CutLayout(acker_pb2.CutLayoutRequest(epoch=epoch), timeout=5)

    def commit(self, epoch: int) -> None:
        self.stub.CommitLayout(acker_pb2.CommitLayoutRequest(epoch=epoch), timeout=5)

    def close(self) -> None:
        self.channel.close()


def _refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


@pytest.fixture
def two_to_three(servers):
    """Ackers a, b (shards 0, 1 of 2) and c (joining as shard 2 of 3), each as an :class:`Acker`."""
    ackers = [Acker(servers(0, 2).address), Acker(servers(1, 2).address), Acker(servers(2, 3).address)]
    yield ackers
    for acker in ackers:
        acker.close()


# Roots by (old owner of 2, new owner of 3): r % 6 says both.
STAY_A = 6 * 1000 + 0  # a, a
B_TO_A = 6 * 1000 + 3  # b -> a
A_TO_C = 6 * 1000 + 2  # a -> c
STAY_B = 6 * 1000 + 1  # b, b


def test_mid_move_a_non_moving_root_applies_at_once_and_a_moving_one_waits_for_its_handoff(two_to_three):
    """Prepared, not cut: a and b serve the roots they keep; a holds b's root until b's cut hands its entry over."""
    a, b, c = two_to_three
    old, new = [a.address, b.address], [a.address, b.address, c.address]
    for root, owner in ((STAY_A, a), (B_TO_A, b), (A_TO_C, a), (STAY_B, b)):
        owner.apply([(INIT, root, 5 ^ 9), (ACK, root, 5)], key=root << 8)
    for acker in (a, b, c):
        acker.prepare(1, new, old)
    assert not b.stub.Describe(acker_pb2.DescribeRequest(), timeout=5).HasField("next_layout"), "named from the cut on"

    # The move is held mid-way here: every acker prepared, none cut.
    done = a.apply([(ACK, STAY_A, 9)], key=1 << 40)
    assert (done.applied, done.held) == (1, 0) and a.counts() == (1, 1), "a's own root: ACKED at once"
    held = a.apply([(ACK, B_TO_A, 9)], key=2 << 40)
    assert (held.applied, held.held) == (0, 1)
    assert a.counts() == (1, 1) and b.counts() == (2, 0), "held unapplied: the tree is still b's, pending"
    assert b.apply([(ACK, STAY_B, 9)], key=3 << 40).applied == 1 and b.counts() == (1, 1)
    assert a.apply([(ACK, A_TO_C, 0)], key=4 << 40).applied == 1, "an old owner serves what it gives away until its cut"

    assert b.cut(1).moved_trees == 1
    assert a.counts() == (1, 2), "b's handoff merged: the held ack applied, the tree ACKED at its new owner"
    error = _refused(lambda: b.apply([(ACK, B_TO_A, 9)], key=2 << 40))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "moved to shard 0" in error.details()
    info = b.stub.Describe(acker_pb2.DescribeRequest(), timeout=5)
    assert (info.move_state, info.next_layout.epoch, list(info.next_layout.addresses)) == ("cut", 1, new)
    again = a.apply([(ACK, B_TO_A, 9)], key=2 << 40)
    assert again.held == 0 and a.counts() == (1, 2), "b merged: applied at once (the tree ended: a mere orphan)"

    held_c = c.apply([(ACK, A_TO_C, 9)], key=5 << 40)
    assert held_c.held == 1 and c.counts() == (0, 0), "c awaits a's handoff"
    assert a.cut(1).moved_trees == 1 and c.cut(1).moved_trees == 0
    assert c.counts() == (0, 1) and a.counts() == (0, 2)
    for acker in (a, b, c):
        acker.commit(1)


def test_a_request_mixing_roots_is_split_per_operation_or_refused_whole(two_to_three):
    """At a new owner one request applies its staying roots and holds its arriving ones; a root that left refuses it all."""
    a, b, c = two_to_three
    old, new = [a.address, b.address], [a.address, b.address, c.address]
    for root, owner in ((STAY_A, a), (B_TO_A, b), (A_TO_C, a)):
        owner.apply([(INIT, root, 5 ^ 9), (ACK, root, 5)], key=root << 8)
    for acker in (a, b, c):
        acker.prepare(1, new, old)
    mixed = a.apply([(ACK, STAY_A, 9), (ACK, B_TO_A, 9)], key=1 << 40)
    assert (mixed.applied, mixed.held) == (1, 1) and a.counts() == (1, 1)
    a.cut(1)
    assert a.counts() == (0, 1), "A_TO_C left at the cut"
    refused = _refused(lambda: a.apply([(INIT, STAY_A + 6, 1), (ACK, A_TO_C, 9)], key=2 << 40))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and f"root {A_TO_C} moved" in refused.details()
    assert a.counts() == (0, 1), "refused whole: the staying root's init was not applied either"
    b.cut(1)
    c.cut(1)
    assert a.counts() == (0, 2) and c.counts() == (1, 0)


def test_the_client_follows_a_cut_and_its_re_routed_ops_wait_at_the_new_owner(two_to_three):
    """A client refused by a cut old owner learns the next layout; its ack for a root still moving is held, then applies."""
    a, b, c = two_to_three
    old, new = [a.address, b.address], [a.address, b.address, c.address]
    client = ClusterClient(old, flush_interval=0.001, wait_for_shard=10.0)
    try:
        for root in (A_TO_C, B_TO_A):
            client.init(root, 5 ^ 9, SPOUT)
            client.ack(root, 5)
        client.flush()
        for acker in (a, b, c):
            acker.prepare(1, new, old)
        b.cut(1)
        client.ack(B_TO_A, 9)
        client.flush()
        assert client.layout_epoch == 1 and client.shard_count == 3, "learnt from b's refusal and Describe"
        assert client.stats.batches_rerouted == 1 and a.counts() == (1, 1), "re-routed to a, which had b's entry"
        client.ack(A_TO_C, 9)
        client.flush()
        assert client.stats.held == 1 and c.counts() == (0, 0), "routed to c by the next layout: held for a's cut"
        assert a.cut(1).moved_trees == 1
        assert c.counts() == (0, 1) and a.counts() == (0, 1), "a's entry merged at c, then the held ack: ACKED"
        c.cut(1)
        for acker in (a, b, c):
            acker.commit(1)
    finally:
        client.close()


def test_held_operations_are_bounded_with_a_refusal_that_changes_nothing(servers):
    """Past --max-held-operations a request is refused whole (UNAVAILABLE, retry); below it, held."""
    a = Acker(servers(0, 2, max_held_operations=2).address)
    b_address = "127.0.0.1:1"  # never contacted: the test hands b's entries over itself
    try:
        a.prepare(1, [a.address], [a.address, b_address])
        refused = _refused(lambda: a.apply([(ACK, 1, 1), (ACK, 3, 1), (ACK, 5, 1), (INIT, 4, 1)], key=1 << 40))
        assert refused.code() == grpc.StatusCode.UNAVAILABLE and "--max-held-operations 2" in refused.details()
        assert a.counts() == (0, 0), "nothing applied: the staying root 4 waits with the rest"
        assert a.apply([(ACK, 1, 1), (ACK, 3, 1)], key=2 << 40).held == 2
        assert _refused(lambda: a.apply([(ACK, 5, 1)], key=3 << 40)).code() == grpc.StatusCode.UNAVAILABLE
    finally:
        a.close()


def _handoff(source: int, chunks: int, key: int, entries: MovedEntries) -> acker_pb2.HandoffRequest:
    request = to_request(1, entries)
    request.source, request.chunks, request.chunk_key = source, chunks, key
    return request


def test_held_operations_apply_once_every_chunk_of_the_old_owner_is_merged_each_once(servers):
    """A resent chunk merges nothing; the held ack applies after the last chunk (an empty one), not before."""
    a = Acker(servers(0, 2).address)
    try:
        a.prepare(1, [a.address], [a.address, "127.0.0.1:1"])
        root = 7  # old owner: shard 1 of 2
        assert a.apply([(ACK, root, 9)], key=1 << 40).held == 1
        chunk = _handoff(1, 2, 99, MovedEntries([root], [9 ^ 5], ["s"], [0], [0], [0], [False], [0], [0], []))
        assert a.stub.Handoff(chunk, timeout=5).imported == 1
        assert a.stub.Handoff(chunk, timeout=5).imported == 0
        assert a.counts() == (1, 0), "one chunk of two merged: the ack is still held"
        assert a.stub.Handoff(_handoff(1, 2, 100, MovedEntries()), timeout=5).imported == 0
        assert a.counts() == (1, 0), "9 ^ 5 merged once, then the held ack of 9: 5 left, pending"
        assert a.apply([(ACK, root, 5)], key=2 << 40).applied == 1 and a.counts() == (0, 1)
        late = _refused(lambda: a.stub.Handoff(_handoff(1, 2, 101, MovedEntries()), timeout=5))
        assert late.code() == grpc.StatusCode.FAILED_PRECONDITION and "merged already" in late.details()
        bad = _refused(lambda: a.stub.Handoff(_handoff(5, 1, 102, MovedEntries()), timeout=5))
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and "source" in bad.details()
        a.cut(1)
        a.commit(1)
    finally:
        a.close()


def test_the_first_chunks_manifest_releases_roots_not_coming_and_each_chunk_its_own(servers):
    """Held: an ack of a root in the first chunk, one in the second, an init of a root in none; each applies when it can."""
    a = Acker(servers(0, 2).address)
    try:
        a.prepare(1, [a.address], [a.address, "127.0.0.1:1"])
        first, second, new_tree = 9, 7, 11  # all old shard 1's
        assert a.apply([(ACK, first, 9 ^ 5), (ACK, second, 7 ^ 5), (INIT, new_tree, 3)], key=1 << 40).held == 3
        assert a.counts() == (0, 0)

        def entry(root: int) -> MovedEntries:
            return MovedEntries([root], [root ^ 5], ["s"], [0], [0], [0], [False], [0], [0], [])

        chunk = _handoff(1, 2, 1, entry(first))
        chunk.manifest.extend([second, first])
        a.stub.Handoff(chunk, timeout=5)
        assert a.counts() == (1, 1), "first: merged, then its held ack ACKED it; new_tree: not coming, its init applied"
        a.stub.Handoff(_handoff(1, 2, 2, entry(second)), timeout=5)
        assert a.counts() == (1, 2), "second: its chunk merged, its held ack applied"
        a.cut(1)
        a.commit(1)
    finally:
        a.close()


def test_layout_steps_out_of_order_are_refused_with_the_reason(two_to_three):
    """Commit before cut, a second change mid-way and a commit before every handoff arrived are refused."""
    a, b, c = two_to_three
    old, new = [a.address, b.address], [a.address, b.address, c.address]
    assert _refused(lambda: a.commit(1)).code() == grpc.StatusCode.FAILED_PRECONDITION
    for acker in (a, b, c):
        acker.prepare(1, new, old)
    busy = _refused(lambda: a.prepare(2, [a.address], new))
    assert busy.code() == grpc.StatusCode.FAILED_PRECONDITION and "in progress" in busy.details()
    a.cut(1)
    early = _refused(lambda: a.commit(1))
    assert early.code() == grpc.StatusCode.FAILED_PRECONDITION and "old shards [1]" in early.details()
    b.cut(1)
    c.cut(1)
    for acker in (a, b, c):
        acker.commit(1)
    assert a.stub.Describe(acker_pb2.DescribeRequest(), timeout=5).move_state == "serving"


class _Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


def test_a_re_routed_part_refused_by_an_owner_not_yet_moved_is_sent_again_not_dropped(servers, monkeypatch):
    """FAILED_PRECONDITION from a new owner whose layout is older (its step comes later): retried until applied."""
    client = ClusterClient([servers(0, 1).address], verify=False, wait_for_shard=10.0)
    answers = [_Refused(grpc.StatusCode.FAILED_PRECONDITION)] * 2 + [None]
    sent: list[bytes] = []

    def send(data: bytes, timeout: float, wait_for_ready: bool) -> object:
        sent.append(data)
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        return acker_pb2.ApplyResponse(applied=1)

    monkeypatch.setattr(client, "_relayout", lambda *args: False)  # Describe shows no newer layout there
    monkeypatch.setattr("acker_client.cluster.time.sleep", lambda seconds: None)
    try:
        state = client._state()
        assert client._send_part(state, 0, b"part", send, give_up_at=float("inf"), depth=0)
        assert sent == [b"part"] * 3
        answers[:] = [_Refused(grpc.StatusCode.INVALID_ARGUMENT)]
        assert not client._send_part(state, 0, b"bad", send, give_up_at=float("inf"), depth=0)
    finally:
        client.close()
