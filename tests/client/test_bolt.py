"""BoltCollector: Storm's anchoring algebra, ack/fail messages, hold mode, checked against an XOR model."""

from __future__ import annotations

import pytest
from acker_client import BoltCollector, MessageId, TrackedTuple
from acker_client.bolt import COLUMNS_FROM

from .fakes import RecordingCluster


def spout_tuple(cluster: RecordingCluster, root: int = 0x1234, edges=(0xAAAA,)) -> list[TrackedTuple]:
    """What a spout does: init(root, xor of edges) and one tuple per edge."""
    value = 0
    for e in edges:
        value ^= e
    cluster.init(root, value, "s")
    return [TrackedTuple(f"t{i}", MessageId.single(root, e)) for i, e in enumerate(edges)]


class CountingEdges:
    """A deterministic EdgeIdSource recording the ordinals it was asked for."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.next = 0x100

    def edge_id(self, anchor, ordinal):
        self.asked.append(ordinal)
        self.next += 1
        return self.next


def test_emit_sends_nothing_and_updates_out_ack_val():
    """Emitting anchors the child via edge ids and sends no message (the edge travels with the anchor's ack)."""
    cluster, edges = RecordingCluster(), CountingEdges()
    bolt = BoltCollector(cluster, edge_ids=edges)
    (t,) = spout_tuple(cluster)
    calls_before = len(cluster.calls)
    c1 = bolt.emit("a", [t])
    c2 = bolt.emit("b", [t])
    assert len(cluster.calls) == calls_before
    assert c1.message_id == MessageId.single(0x1234, 0x101) and c2.message_id == MessageId.single(0x1234, 0x102)
    assert t.out_ack_val == 0x101 ^ 0x102
    assert edges.asked == [0, 1] and t.emit_ordinal == 2


def test_chain_completes_only_after_last_ack():
    """spout -> bolt -> bolt: the modelled checksum reaches 0 exactly at the last ack."""
    cluster = RecordingCluster()
    b1, b2 = BoltCollector(cluster), BoltCollector(cluster)
    (t,) = spout_tuple(cluster)
    mid = b1.emit("mid", [t])
    b1.ack(t)
    assert not cluster.complete(0x1234)
    leaf = b2.emit("leaf", [mid])
    b2.ack(mid)
    assert not cluster.complete(0x1234)
    b2.ack(leaf)
    assert cluster.complete(0x1234)
    acks = [c for c in cluster.calls if c[0] == "ack"]
    assert acks[0] == ("ack", 0x1234, t.message_id[0x1234] ^ t.out_ack_val, 0)


def test_fan_out_and_spout_to_several_targets():
    """A spout record sent to 2 targets, each fanning out to 3 children, completes at the last of 8 acks."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster)
    tuples = spout_tuple(cluster, edges=(0x11, 0x22))
    pending = []
    for t in tuples:
        pending.extend(bolt.emit(i, [t]) for i in range(3))
        pending.append(t)
    for t in pending[:-1]:
        bolt.ack(t)
        assert not cluster.complete(0x1234)
    bolt.ack(pending[-1])
    assert cluster.complete(0x1234)


def test_dag_anchored_to_two_roots():
    """A join tuple anchored to two trees carries both roots; each tree completes only when the join is acked."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster)
    (a,) = spout_tuple(cluster, root=0xA1, edges=(0x5,))
    (b,) = spout_tuple(cluster, root=0xB2, edges=(0x7,))
    join = bolt.emit("join", [a, b])
    assert set(join.message_id.roots) == {0xA1, 0xB2}
    bolt.ack(a)
    bolt.ack(b)
    assert not cluster.complete(0xA1) and not cluster.complete(0xB2)
    bolt.ack(join)
    assert cluster.complete(0xA1) and cluster.complete(0xB2)


def test_anchor_with_two_roots_propagates_both():
    """A child of a two-root tuple inherits both roots with the same new edge id."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster)
    (a,) = spout_tuple(cluster, root=0xA1, edges=(0x5,))
    (b,) = spout_tuple(cluster, root=0xB2, edges=(0x7,))
    join = bolt.emit("join", [a, b])
    child = bolt.emit("child", [join])
    for t in (a, b, join, child):
        bolt.ack(t)
    assert cluster.complete(0xA1) and cluster.complete(0xB2)
    assert child.message_id[0xA1] == child.message_id[0xB2] == join.out_ack_val


def test_fail_sends_fail_per_root():
    """Failing a two-root tuple sends one FAIL per root."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster)
    (a,) = spout_tuple(cluster, root=0xA1)
    (b,) = spout_tuple(cluster, root=0xB2)
    bolt.fail(bolt.emit("join", [a, b]))
    assert cluster.failed == {0xA1, 0xB2}


def test_unanchored_emit_is_untracked():
    """An emit without anchors has an empty MessageId and acking it sends nothing."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster)
    t = bolt.emit("free")
    assert t.message_id == MessageId.EMPTY
    child = bolt.emit("child of free", [bolt.emit("free 2")])
    bolt.ack(t)
    bolt.ack(child)
    assert child.message_id == MessageId.EMPTY
    assert cluster.calls == []


def test_reset_timeout_per_root():
    """reset_timeout sends one RESET_TIMEOUT per root of the tuple."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster)
    (a,) = spout_tuple(cluster, root=0xA1)
    bolt.reset_timeout(a)
    assert cluster.calls[-1] == ("reset_timeout", 0xA1)


def test_double_ack_is_refused():
    """Acking a tuple twice would corrupt its tree's checksum, so the second ack raises."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster)
    (t,) = spout_tuple(cluster)
    bolt.ack(t)
    with pytest.raises(ValueError):
        bolt.ack(t)
    with pytest.raises(ValueError):
        bolt.emit("late child", [t])


def test_zero_edge_id_is_refused():
    """An EdgeIdSource returning 0 is a bug that would make an edge invisible; emit raises."""

    class Zero:
        def edge_id(self, anchor, ordinal):
            return 0

    cluster = RecordingCluster()
    (t,) = spout_tuple(cluster)
    with pytest.raises(ValueError):
        BoltCollector(cluster, edge_ids=Zero()).emit("x", [t])


def test_hold_mode_commit_folds_per_root_with_key():
    """In hold mode nothing is sent until commit, which sends one keyed ack per root plus fails, then flushes."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster, hold=True)
    (a,) = spout_tuple(cluster, root=0xA1)
    (b,) = spout_tuple(cluster, root=0xB2)
    kids = [bolt.emit(i, [a]) for i in range(3)]
    bolt.ack(a)
    for k in kids:
        bolt.ack(k)
    bolt.fail(b)
    sent_before = len(cluster.calls)
    assert bolt.held == 2
    bolt.commit(dedup_key=77)
    sent = cluster.calls[sent_before:]
    assert ("fail", 0xB2) in sent
    # a's ack (id ^ its 3 children's edges) and the 3 children's acks fold to one ack: a's id.
    assert [c for c in sent if c[0] == "ack"] == [("ack", 0xA1, a.message_id[0xA1], 77)]
    assert cluster.complete(0xA1)
    assert cluster.flushes == 1 and bolt.held == 0


def test_hold_mode_sends_keyed_partial_acks():
    """A committed attempt that acked only part of a tree sends one ack per root carrying the dedup key."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster, hold=True)
    (a,) = spout_tuple(cluster, root=0xA1)
    child = bolt.emit("c", [a])
    bolt.ack(a)
    bolt.commit(dedup_key=77)
    acks = [c for c in cluster.calls if c[0] == "ack"]
    assert acks == [("ack", 0xA1, a.message_id[0xA1] ^ child.message_id[0xA1], 77)]


def test_hold_mode_discard_sends_nothing():
    """discard() drops held acks and fails: a failed attempt changes no ledger."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster, hold=True)
    (a,) = spout_tuple(cluster, root=0xA1)
    bolt.ack(a)
    bolt.fail(TrackedTuple("y", MessageId.single(0xA1, 9)))
    bolt.discard()
    bolt.commit()
    assert [c for c in cluster.calls if c[0] != "init"] == []


def test_commit_without_hold_is_an_error():
    """commit() on a collector that sends immediately is a programming error."""
    with pytest.raises(RuntimeError):
        BoltCollector(RecordingCluster()).commit()


def test_one_anchor_however_passed_gives_the_same_child():
    """A bare tuple, a list or a tuple of one anchor take the same path: same edge, same child ids."""
    children = []
    for wrap in (lambda t: t, lambda t: [t], lambda t: (t,)):
        cluster = RecordingCluster()
        (a,) = spout_tuple(cluster, root=0xA1, edges=(0x5,))
        children.append(BoltCollector(cluster, edge_ids=CountingEdges()).emit("c", wrap(a)).message_id)
        assert a.out_ack_val == 0x101 and a.emit_ordinal == 1
    assert children == [MessageId.single(0xA1, 0x101)] * 3


def test_hold_mode_folds_many_roots_like_the_model():
    """300 trees acked in hold mode complete exactly as the XOR model says after one commit."""
    cluster = RecordingCluster()
    bolt = BoltCollector(cluster, hold=True)
    roots = list(range(1, 301))
    for root in roots:
        (t,) = spout_tuple(cluster, root=root, edges=(root * 7,))
        kids = [bolt.emit(i, [t]) for i in range(root % 4)]
        bolt.ack(t)
        for k in kids[: len(kids) - (root % 2)]:  # odd roots leave their last child unacked
            bolt.ack(k)
    bolt.commit(dedup_key=9)
    assert all(cluster.complete(r) == (r % 2 == 0) for r in roots)


class ColumnCluster(RecordingCluster):
    """A RecordingCluster that also takes acks as columns, as ClusterClient does."""

    def ack_columns(self, roots, values, dedup_key=0):
        self.calls.append(("ack_columns", len(roots), dedup_key))
        for root, value in zip(roots.tolist(), values.tolist()):
            self.vals[root] ^= value


@pytest.mark.parametrize("trees", [COLUMNS_FROM - 1, COLUMNS_FROM, 500])
def test_commit_of_many_roots_sends_columns(trees):
    """A commit holding acks for COLUMNS_FROM roots or more sends one column call; fewer go one ack each."""
    cluster = ColumnCluster()
    bolt = BoltCollector(cluster, hold=True)
    for root in range(1, trees + 1):
        (t,) = spout_tuple(cluster, root=root, edges=(root * 3,))
        bolt.ack(t)
    bolt.commit(dedup_key=5)
    columns = [c for c in cluster.calls if c[0] == "ack_columns"]
    assert columns == ([("ack_columns", trees, 5)] if trees >= COLUMNS_FROM else [])
    assert len([c for c in cluster.calls if c[0] == "ack"]) == (0 if columns else trees)
    assert all(cluster.complete(root) for root in range(1, trees + 1))


def test_withhold_drops_the_held_operations_of_unreachable_shards_and_a_fails_reason_is_kept():
    """withhold(shards, n) removes those shards' roots from the next commit and names them; fail reasons survive."""
    cluster = RecordingCluster(shard_count=3)
    bolt = BoltCollector(cluster, hold=True)
    (a,) = spout_tuple(cluster, root=3 * 7 + 1)  # shard 1
    (b,) = spout_tuple(cluster, root=3 * 7 + 2)  # shard 2
    (c,) = spout_tuple(cluster, root=3 * 8 + 1)  # shard 1
    bolt.ack(a)
    bolt.fail(b, "bad value")
    bolt.fail(c)
    assert bolt.withhold({1}, 3) == (a.message_id.roots[0], c.message_id.roots[0])
    bolt.commit(dedup_key=5)
    assert [call for call in cluster.calls if call[0] != "init"] == [("fail", b.message_id.roots[0])]
    assert bolt.fail_reasons == {b.message_id.roots[0]: "bad value"}
