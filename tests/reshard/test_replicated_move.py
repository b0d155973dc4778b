"""A layout change of a cluster with two replicas: both copies of a tree move (issue 39 item 2).

The rules are the seeded simulation's (docs/simulation.md, "Reshard with two
replicas"): a root moves when the set of two ackers keeping it changes, and
each old copy moves to exactly one new keeper: a keeper that stays keeps its
own copy and serves the root throughout, a keeper that leaves serves it until
its own cut and then hands its copy to the one new keeper it is paired with
(old owner -> new owner and old follower -> new follower when both change),
which holds the root's operations until that copy is merged. Nothing is
dropped. First the pure rules (LayoutMachine), then real in-process ackers
driven step by step (among them a lagging source, which the rule before this
one lost trees to), then a client that follows the move.

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
BC_TO_AB = 12 * 1000 + 4  # {b, c} -> {a, b}: b stays and keeps its copy, c leaves and hands its copy to a
AB_TO_CD = 12 * 1000 + 6  # {a, b} -> {c, d}: both leave: a (old owner) -> c (new owner), b -> d
BC_TO_DA = 12 * 1000 + 7  # {b, c} -> {d, a}: both leave: b (old owner) -> d (new owner), c -> a


def _machine(address: str, old: tuple[str, ...] = OLD, new: tuple[str, ...] = NEW) -> LayoutMachine:
    before = old.index(address) if address in old else -1
    m = LayoutMachine(Layout(0, len(old), before, old), replicas=2)
    m.prepare(Layout(1, len(new), new.index(address) if address in new else -1, new), Layout(0, len(old), before, old))
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


def test_before_its_cut_an_old_keeper_serves_what_it_keeps_and_a_newcomer_holds_for_its_leaver():
    b = _machine("b:1")
    assert b.awaiting == {0, 2}, "b awaits every other old acker's handoff, not its own: it keeps its copies"
    route = b.route(_roots(STAY_AB, BC_TO_AB, AB_TO_CD, BC_TO_DA))
    assert (route.source.tolist(), route.refused) == ([-1] * 4, -1), "b keeps all four in the layout left"
    a = _machine("a:1")
    held = a.route(_roots(STAY_AB, BC_TO_AB, BC_TO_DA))
    assert (held.source.tolist(), held.refused) == ([-1, 2, 2], -1), (
        "new to a: held for c, the old keeper paired with a"
    )
    assert a.route(_roots(BC_TO_DA)).source.tolist() == [2]
    a.source_merged(2)
    assert a.route(_roots(BC_TO_AB, BC_TO_DA)).source.tolist() == [-1, -1], "c's handoff merged: no cut of a's needed"


def test_from_its_cut_a_leaving_keeper_refuses_the_roots_it_leaves_whatever_layout_routed_them():
    b = _machine("b:1")
    b.mark_cut()
    assert b.route(_roots(STAY_AB, STAY_BC)).refused == -1, "roots that stay are served"
    assert b.route(_roots(STAY_AB, BC_TO_AB)).source.tolist() == [-1, -1], "b stays a keeper of BC_TO_AB: it applies"
    assert b.route(_roots(STAY_AB, AB_TO_CD)).refused == 1, "b leaves AB_TO_CD: refused from its cut"
    assert "every copy" in b.refusal(AB_TO_CD) and "shard 2 (c:1) and shard 3 (d:1)" in b.refusal(AB_TO_CD)


def test_a_cut_takes_out_only_the_roots_it_leaves_each_for_one_new_keeper():
    roots = _roots(STAY_AB, STAY_BC, BC_TO_AB, AB_TO_CD, BC_TO_DA)
    b = _machine("b:1").cut_plan(roots)
    assert b.leave.tolist() == [AB_TO_CD, BC_TO_DA], "b keeps its copy of BC_TO_AB (it stays a keeper)"
    assert b.targets.tolist() == [3, 3], "AB_TO_CD: old follower -> new follower d; BC_TO_DA: old owner -> new owner d"
    c = _machine("c:1").cut_plan(roots)
    assert (c.leave.tolist(), c.targets.tolist()) == ([BC_TO_AB, BC_TO_DA], [0, 0]), "c's copies both go to a"
    a = _machine("a:1").cut_plan(roots)
    assert (a.leave.tolist(), a.targets.tolist()) == ([AB_TO_CD], [2]), "old owner a -> new owner c"
    assert _machine("d:1").cut_plan(roots).leave.tolist() == [], "d kept nothing"
    assert _machine("d:1").handoff_sources(_roots(AB_TO_CD, BC_TO_DA)).tolist() == [1, 1], "d takes both from b"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (OLD, NEW),
        (NEW, OLD),
        (("a:1", "b:1", "c:1", "d:1"), ("a:1", "c:1", "d:1")),  # a drain of b
        (("a:1", "b:1"), ("c:1", "a:1", "d:1", "e:1", "b:1")),
        (("a:1", "b:1", "c:1", "d:1", "e:1"), ("e:1", "d:1")),
    ],
)
def test_every_old_copy_goes_to_exactly_one_new_keeper_and_each_newcomer_takes_exactly_one(old, new):
    """The pairing every acker computes from the two layouts alone: the leavers' targets are the newcomers, one each."""
    roots = _roots(*range(1, 1 + 2 * 3 * 4 * 5 * 7))
    machines = {address: _machine(address, old, new) for address in set(old) | set(new)}
    given: dict[tuple[int, str], str] = {}  # (root, newcomer) -> the leaver handing it its copy
    for address, m in machines.items():
        plan = m.cut_plan(roots)
        for root, target in zip(plan.leave.tolist(), plan.targets.tolist()):
            assert (root, new[target]) not in given, f"root {root}: two copies for {new[target]}"
            given[(root, new[target])] = address
    moves = next(iter(machines.values())).moves(roots)
    for root, moving in zip(roots.tolist(), moves.tolist()):
        before = {old[root % len(old)], old[(root + 1) % len(old)]}
        after = {new[root % len(new)], new[(root + 1) % len(new)]}
        assert moving == (before != after)
        newcomers = after - before if moving else set()
        assert {k for (r, k) in given if r == root} == newcomers, f"root {root}: every newcomer gets one copy"
        for newcomer in newcomers:
            m = machines[newcomer]
            source = m.handoff_sources(_roots(root)).tolist()[0]
            assert old[source] == given[(root, newcomer)], "the newcomer awaits the leaver that hands it the copy"
        if moving and not newcomers & {new[root % len(new)]} and len(newcomers) == 2:
            assert given[(root, new[root % len(new)])] == old[root % len(old)], "both change: owner -> owner"


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


@pytest.fixture
def three_to_four(servers):  # noqa: F811 (the fixture imported above)
    """Ackers a, b, c (shards 0..2 of 3, two replicas) and d, joining, each as an :class:`Acker`."""
    made = [servers(i, 3, replicas=2) for i in range(3)] + [servers(3, 3, replicas=2, join=True)]
    ackers = [Acker(s.address) for s in made]
    yield ackers
    for acker in ackers:
        acker.close()


def test_each_old_copy_moves_to_one_new_keeper_and_every_operation_applies_once_at_each(three_to_four):
    """Real ackers stopped between the steps: keepers that stay serve throughout, leavers until their cut, newcomers hold."""
    a, b, c, d = three_to_four
    old, new = [a.address, b.address, c.address], [a.address, b.address, c.address, d.address]
    for root, keepers in ((BC_TO_AB, (b, c)), (AB_TO_CD, (a, b)), (STAY_AB, (a, b))):
        for k in keepers:
            k.apply([(INIT, root, 5 ^ 9 ^ 17), (ACK, root, 5)], key=root << 8)
    for acker in (a, b, c, d):
        acker.prepare(1, new, old)

    # Prepared, none cut: a newcomer holds a moving root's operations, every old keeper serves what it keeps.
    assert a.apply([(ACK, BC_TO_AB, 9)], key=1 << 40, epoch=1).held == 1, "new to a: held for c's copy"
    assert b.apply([(ACK, BC_TO_AB, 9)], key=1 << 40, epoch=1).applied == 1, "b stays a keeper: applied at once"
    for k in (a, b):
        assert k.apply([(ACK, STAY_AB, 9)], key=2 << 40, epoch=1).applied == 1
    assert c.apply([(ACK, BC_TO_AB, 9)], key=1 << 40).applied == 1, "c serves what it leaves until its cut"
    assert [x.counts() for x in (a, b, c, d)] == [(2, 0), (3, 0), (1, 0), (0, 0)]

    assert c.cut(1).moved_trees == 1, "c hands its copy of BC_TO_AB to a"
    refused = _refused(lambda: c.apply([(ACK, BC_TO_AB, 17)], key=3 << 40))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "every copy" in refused.details()
    assert c.counts() == (0, 0), "c kept no copy of a root it left"
    assert a.counts() == (3, 0), "a merged c's copy before its own cut; the held 9 applied on it (deduplicated)"
    for k in (a, b):  # the last ack, by the next layout (its old-layout copy was refused by c)
        k.apply([(ACK, BC_TO_AB, 17)], key=3 << 40, epoch=1)
    assert (a.counts(), b.counts()) == ((2, 1), (2, 1)), "BC_TO_AB ACKED at both keepers (init, 5, 9, 17 once each)"

    assert b.cut(1).moved_trees == 1, "b hands its copy of AB_TO_CD to d (old follower -> new follower)"
    assert a.cut(1).moved_trees == 1, "a hands its copy of AB_TO_CD to c (old owner -> new owner)"
    for k in (c, d):
        k.apply([(ACK, AB_TO_CD, 9 ^ 17)], key=4 << 40, epoch=1)
    assert (c.counts(), d.counts()) == ((0, 1), (0, 1)), "AB_TO_CD: each newcomer has one old copy, then the ack: ACKED"
    d.cut(1)
    for k in (a, b):
        k.apply([(ACK, STAY_AB, 17)], key=5 << 40, epoch=1)
    for acker in (a, b, c, d):
        acker.commit(1)
    assert [x.counts() for x in (a, b, c, d)] == [(0, 2), (0, 2), (0, 1), (0, 1)], "each tree ACKED once per keeper"


@pytest.mark.parametrize("root", [AB_TO_CD, BC_TO_AB])
def test_a_lagging_source_loses_nothing_the_follower_applied(three_to_four, root):
    """The old follower applied an ack the source never got (a client skipped the source's copy, reason replica).

    The rule before this one handed the source's copy to both new keepers and
    dropped the follower's: the tree then missed that ack everywhere, timed out and
    was replayed (both cases fail so on that code: no keeper ACKs). Now the
    follower's copy moves to one new keeper (AB_TO_CD: b -> d; BC_TO_AB: c -> a,
    while the source b stays with its own copy), so one new keeper holds every
    update and ACKs the tree once it completes.
    """
    a, b, c, d = three_to_four
    old, new = [a.address, b.address, c.address], [a.address, b.address, c.address, d.address]
    source, follower = (a, b) if root == AB_TO_CD else (b, c)
    for k in (source, follower):
        k.apply([(INIT, root, 5 ^ 9 ^ 17), (ACK, root, 5)], key=root << 8)
    follower.apply([(ACK, root, 9)], key=1 << 40)  # the source's copy of this ack was skipped
    for acker in (a, b, c, d):
        acker.prepare(1, new, old)
    for acker in (a, b, c, d):
        acker.cut(1)
    for acker in (a, b, c, d):
        acker.commit(1)
    keepers = (c, d) if root == AB_TO_CD else (a, b)
    for k in keepers:  # the tree's last ack, by the next layout, to both keepers
        k.apply([(ACK, root, 17)], key=2 << 40, epoch=1)
    acked = [k.counts()[1] for k in keepers]
    assert sorted(acked) == [0, 1], f"one new keeper has the follower's whole history and ACKs the tree: {acked}"
    full = keepers[acked.index(1)]
    assert full is (d if root == AB_TO_CD else a), "the follower's copy went to its paired newcomer"
    lagging = keepers[acked.index(0)]
    assert lagging.counts() == (1, 0), "the source's copy lacks the ack, as it would without a move: it times out"


def test_the_client_sends_every_copy_again_by_the_next_layout(three_to_four):
    """Refused by a cut old keeper, a two-replica client re-routes both copies to the new keepers."""
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
        client.ack(BC_TO_AB, 9)
        client.flush()
        assert client.layout_epoch == 1 and client.stats.batches_rerouted >= 1
        assert b.counts()[1] == 1, "b (stays a keeper) applied the ack once (its copy again is a repeat): ACKED"
        assert a.counts() == (0, 1), "a merged c's copy at c's cut, then applied the re-routed ack: ACKED"
        for acker in (a, b, d):
            acker.cut(1)
        for acker in (a, b, c, d):
            acker.commit(1)
    finally:
        client.close()
