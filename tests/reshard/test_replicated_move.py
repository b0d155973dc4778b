"""A layout change of a cluster with two replicas: both copies of a tree move (issue 39 item 2).

The rules are the seeded simulation's (docs/simulation.md, "Reshard with two
replicas"): a root moves when the set of two ackers keeping it changes; its
old owner (the source) hands its entry to each new holder, itself too when it
stays one, and the other old holder drops its copy; every request names the
layout epoch it was routed by, and on a moving root an old holder serves the
old layout's operations only until its own cut, a new holder holds the next
layout's until its own cut and the source's entry. First the pure rules
(LayoutMachine), then real in-process ackers driven step by step, then a
client that follows the move.

Layouts: a, b, c (shards 0..2 of 3) grow to a, b, c, d (0..3 of 4). With two
replicas root r is kept by shard r % n and the next one, so r % 12 says both:
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from acker_client import ClusterClient
from acker_protocol.apply_codec import layout_epoch_of, split_by_holders, with_layout_epoch
from acker_protocol.v1 import acker_pb2

from acker_service.moving.layout import Layout, LayoutMachine, LayoutRefused

from .test_move_holds import ACK, INIT, SPOUT, Acker, _refused, servers  # noqa: F401 (servers: a fixture)

OLD = ("a:1", "b:1", "c:1")
NEW = ("a:1", "b:1", "c:1", "d:1")
STAY_AB = 12 * 1000 + 0  # {a, b} -> {a, b}: not moving
STAY_BC = 12 * 1000 + 1  # {b, c} -> {b, c}: not moving
BC_TO_AB = 12 * 1000 + 4  # {b, c} -> {a, b}: source b stays a holder, c drops its copy, a is new
AB_TO_CD = 12 * 1000 + 6  # {a, b} -> {c, d}: source a leaves it, b drops its copy, c and d are new
BC_TO_DA = 12 * 1000 + 7  # {b, c} -> {d, a}: source b leaves it


def _machine(address: str) -> LayoutMachine:
    m = LayoutMachine(Layout(0, 3, OLD.index(address), OLD), replicas=2)
    m.prepare(Layout(1, 4, NEW.index(address), NEW), Layout(0, 3, OLD.index(address), OLD))
    return m


def _roots(*roots: int) -> np.ndarray:
    return np.array(roots, np.uint64)


def test_a_root_moves_when_its_set_of_holders_changes_not_when_their_roles_do():
    m = _machine("b:1")
    assert m.moves(_roots(STAY_AB, STAY_BC, BC_TO_AB, AB_TO_CD, BC_TO_DA)).tolist() == [False, False, True, True, True]
    # 3 -> 2 of {a, b} keeps every root's set ({a, b} both): nothing moves, roles swapped or not.
    two = LayoutMachine(Layout(0, 2, 0, ("a:1", "b:1")), replicas=2)
    two.prepare(Layout(1, 2, 1, ("b:1", "a:1")), Layout(0, 2, 0, ("a:1", "b:1")))
    assert not two.moves(_roots(*range(1, 9))).any()


def test_before_its_cut_an_old_holder_serves_the_old_layout_and_a_new_holder_holds_the_next_one():
    b = _machine("b:1")
    assert b.awaiting == {0, 1, 2}, "with two replicas b awaits itself too: its own share merges at its cut"
    old = b.route(_roots(STAY_AB, BC_TO_AB, AB_TO_CD), epoch=0)
    assert (old.source.tolist(), old.refused) == ([-1, -1, -1], -1), "b holds all three in the layout left"
    new = b.route(_roots(STAY_AB, BC_TO_AB), epoch=1)
    assert (new.source.tolist(), new.refused) == ([-1, 1], -1), "BC_TO_AB waits for its source b's (own) cut"
    assert b.route(_roots(STAY_AB, AB_TO_CD), epoch=1).refused == 1, "b keeps no copy of AB_TO_CD next"


def test_from_its_cut_an_old_holder_refuses_the_old_layout_on_moving_roots_only():
    b = _machine("b:1")
    b.mark_cut()
    assert b.route(_roots(STAY_AB, STAY_BC), epoch=0).refused == -1, "roots that stay are served by any layout"
    assert b.route(_roots(STAY_AB, BC_TO_AB), epoch=0).refused == 1, "routed by the layout left: refused"
    assert "every copy" in b.refusal(BC_TO_AB) and "shard 0 (a:1) and shard 1 (b:1)" in b.refusal(BC_TO_AB)
    held = b.route(_roots(BC_TO_AB), epoch=1)
    assert held.source.tolist() == [1], "cut, but its own share is not merged yet (merged in the cut's step)"
    b.source_merged(1)
    assert b.route(_roots(BC_TO_AB), epoch=1).source.tolist() == [-1]


def test_a_cut_takes_out_every_moving_root_held_and_hands_on_the_sourced_ones_to_both_new_holders():
    plan = _machine("b:1").cut_plan(_roots(STAY_AB, STAY_BC, BC_TO_AB, AB_TO_CD, BC_TO_DA))
    assert plan.leave.tolist() == [BC_TO_AB, AB_TO_CD, BC_TO_DA]
    assert plan.sourced.tolist() == [True, False, True], "b owned BC_TO_AB and BC_TO_DA; a is AB_TO_CD's source"
    assert [sorted(int(t[i]) for t in plan.targets) for i in range(3)] == [[0, 1], [2, 3], [0, 3]]


def test_a_two_replica_change_needs_both_layouts_addresses():
    m = LayoutMachine(Layout(0, 3, 1), replicas=2)
    with pytest.raises(LayoutRefused, match="must list every acker's address"):
        m.prepare(Layout(1, 4, 1, NEW))
    assert not m.moving


def test_a_request_names_its_layout_epoch_and_splits_to_both_holders():
    data = acker_pb2.ApplyRequest(kinds=[INIT, ACK], root_ids=[BC_TO_AB, AB_TO_CD], values=[3, 5]).SerializeToString()
    assert layout_epoch_of(data) == 0 and layout_epoch_of(with_layout_epoch(data, 7)) == 7
    parts = {s: acker_pb2.ApplyRequest.FromString(p).root_ids for s, p in split_by_holders(data, 4, 2).items()}
    assert {s: list(r) for s, r in parts.items()} == {0: [BC_TO_AB], 1: [BC_TO_AB], 2: [AB_TO_CD], 3: [AB_TO_CD]}


class Replica(Acker):
    """An acker of a replicated cluster: Apply names the layout epoch it was routed by."""

    def apply(self, ops: list[tuple[int, int, int]], key: int = 0, epoch: int = 0) -> acker_pb2.ApplyResponse:
        request = acker_pb2.ApplyRequest(
            kinds=[k for k, _, _ in ops],
            root_ids=[r for _, r, _ in ops],
            values=[v for _, _, v in ops],
            dedup_keys=[key + i if key else 0 for i in range(len(ops))],
            spouts=[SPOUT],
            layout_epoch=epoch,
        )
        return self.stub.Apply(request, timeout=5)


@pytest.fixture
def three_to_four(servers):  # noqa: F811 (the fixture imported above)
    """Ackers a, b, c (shards 0..2 of 3, two replicas) and d, joining, each as a :class:`Replica`."""
    made = [servers(i, 3, replicas=2) for i in range(3)] + [servers(3, 3, replicas=2, join=True)]
    ackers = [Replica(s.address) for s in made]
    yield ackers
    for acker in ackers:
        acker.close()


def test_both_copies_move_and_every_operation_applies_once_at_both_new_holders(three_to_four):
    """Real ackers stopped between the steps: old holders serve until their cut, new ones hold, then both ACK."""
    a, b, c, d = three_to_four
    old, new = [a.address, b.address, c.address], [a.address, b.address, c.address, d.address]
    for root, holders in ((BC_TO_AB, (b, c)), (AB_TO_CD, (a, b)), (STAY_AB, (a, b))):
        for h in holders:
            h.apply([(INIT, root, 5 ^ 9 ^ 17), (ACK, root, 5)], key=root << 8)
    for acker in (a, b, c, d):
        acker.prepare(1, new, old)

    # Prepared, none cut: the next layout's operations on moving roots are held, the rest served.
    for h in (a, b):
        assert h.apply([(ACK, BC_TO_AB, 9)], key=1 << 40, epoch=1).held == 1
        assert h.apply([(ACK, STAY_AB, 9)], key=2 << 40, epoch=1).applied == 1
    assert c.apply([(ACK, BC_TO_AB, 9)], key=1 << 40, epoch=0).applied == 1, "c serves the old layout until its cut"
    assert [x.counts() for x in (a, b, c, d)] == [(2, 0), (3, 0), (1, 0), (0, 0)]

    c.cut(1)  # c: the old follower of BC_TO_AB drops its copy; it is the source of nothing here
    refused = _refused(lambda: c.apply([(ACK, BC_TO_AB, 17)], key=3 << 40, epoch=0))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "every copy" in refused.details()
    assert c.counts() == (0, 0), "c kept no copy of a moving root"

    assert b.cut(1).moved_trees == 1, "b is BC_TO_AB's source (AB_TO_CD's copy is dropped: a is its source)"
    assert b.counts() == (2, 0), "b merged its own share at its cut (and applied the held 9); AB_TO_CD left"
    for h in (a, b):  # the last ack, by the next layout (its old-layout copy was refused by c)
        h.apply([(ACK, BC_TO_AB, 17)], key=3 << 40, epoch=1)
    assert b.counts() == (1, 1), "b: BC_TO_AB ACKED (init, 5, 9, 17, each once)"
    assert a.counts() == (2, 0), "a holds b's chunk, 9 and 17 until its own cut"

    assert a.cut(1).moved_trees == 1, "a hands AB_TO_CD to c and d"
    assert a.counts() == (1, 1), "a merged b's chunk at its cut, then applied 9 and 17: ACKED"
    assert c.counts() == (1, 0), "c was cut: a's chunk merged at once"
    for h in (c, d):
        h.apply([(ACK, AB_TO_CD, 9 ^ 17)], key=4 << 40, epoch=1)
    assert c.counts() == (0, 1), "c: a's entry, then the ack: ACKED"
    assert d.counts() == (0, 0), "d is not cut: a's chunk and the ack wait for its cut"
    d.cut(1)
    assert d.counts() == (0, 1)
    for h in (a, b):
        h.apply([(ACK, STAY_AB, 17)], key=5 << 40, epoch=1)
    for acker in (a, b, c, d):
        acker.commit(1)
    assert [x.counts() for x in (a, b, c, d)] == [(0, 2), (0, 2), (0, 1), (0, 1)], "each tree ACKED once per holder"


def test_the_client_sends_every_copy_again_by_the_next_layout(three_to_four):
    """Refused by a cut old holder, a two-replica client re-routes both copies to the new holders, by epoch 1."""
    a, b, c, d = three_to_four
    old, new = [a.address, b.address, c.address], [a.address, b.address, c.address, d.address]
    client = ClusterClient(old, flush_interval=0.001, wait_for_shard=10.0, replicas=2)
    try:
        client.init(BC_TO_AB, 5 ^ 9, SPOUT)
        client.ack(BC_TO_AB, 5)
        client.flush()
        assert (b.counts(), c.counts()) == ((1, 0), (1, 0))
        for acker in (a, b, c, d):
            acker.prepare(1, new, old)
        c.cut(1)
        b.cut(1)
        client.ack(BC_TO_AB, 9)
        client.flush()
        assert client.layout_epoch == 1 and client.stats.batches_rerouted >= 1
        assert b.counts() == (0, 1), "b (the source, cut) applied the re-routed copy: ACKED"
        assert a.counts() == (0, 0), "a holds its copy until its own cut"
        a.cut(1)
        d.cut(1)
        assert a.counts() == (0, 1), "b's entry merged at a's cut, then the held ack: ACKED"
        for acker in (a, b, c, d):
            acker.commit(1)
    finally:
        client.close()
