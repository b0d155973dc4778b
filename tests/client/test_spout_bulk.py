"""The spout in bulk: emit_many / emit_columns, outcomes settled per batch, on_outcomes next to on_ack / on_fail."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pytest
from acker_client import ShardFailure, ShardUnavailable, Spout, SpoutFull
from acker_client import columns as columns_module
from acker_client.columns import random_ids
from acker_client.subscription import OutcomeSubscription
from acker_protocol.packed import decode_outcome_batch
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import Outcome

from .fakes import RecordingCluster
from .polling import wait_until

ACKED, FAILED, TIMED_OUT = acker_pb2.OUTCOME_ACKED, acker_pb2.OUTCOME_FAILED, acker_pb2.OUTCOME_TIMED_OUT
RESET = acker_pb2.OUTCOME_TIMEOUT_RESET


class BulkRecorder:
    """Collects on_outcomes calls; flattens them to one (message id, 'acked' or reason) per record."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Any], list[tuple[Any, Outcome]]]] = []

    def __call__(self, acked: list[Any], failed: list[tuple[Any, Outcome]]) -> None:
        self.calls.append((list(acked), list(failed)))

    def flat(self) -> list[tuple[Any, Any]]:
        """Every record called back, in order."""
        out: list[tuple[Any, Any]] = []
        for acked, failed in self.calls:
            out.extend((mid, "acked") for mid in acked)
            out.extend(failed)
        return out


class Streams:
    """Pushes outcome batches per shard with consecutive sequence numbers, as an acker would."""

    def __init__(self, cluster: RecordingCluster) -> None:
        self.cluster = cluster
        self.next = defaultdict(lambda: 1)

    def push(self, pairs: list[tuple[int, int]]) -> None:
        """Send ``(root, outcome)`` pairs, one batch per shard, in the order given."""
        by_shard: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for root, outcome in pairs:
            by_shard[root % self.cluster.shard_count].append((root, outcome))
        for shard, items in by_shard.items():
            self.cluster.push(shard, 1, self.next[shard], [r for r, _ in items], [o for _, o in items])
            self.next[shard] += len(items)


def root_of(t) -> int:
    (root,) = t.message_id.roots
    return root


def new_spout(cluster, clock, **callbacks) -> Spout:
    spout = Spout(cluster, timeout=10.0, clock=clock, check_interval=3600.0, **callbacks).start()
    wait_until(lambda: all(s.connected for s in spout.subscriptions), "the outcome streams to open")
    return spout


PLAN = {0: ACKED, 1: FAILED, 2: TIMED_OUT}  # by index % 4; 3: no outcome (the backstop's LOST)
EXPECTED = {0: "acked", 1: Outcome.FAILED, 2: Outcome.TIMED_OUT, 3: Outcome.LOST}


def mixed_scenario(spout: Spout, cluster: RecordingCluster, clock) -> None:
    """40 records over 3 shards: acked, failed, timed out, lost; plus a duplicate per shard and a late outcome."""
    streams = Streams(cluster)
    tracked = spout.emit_many([f"r{i}" for i in range(40)], [f"m{i}" for i in range(40)])
    roots = [root_of(t) for t in tracked]
    pairs = [(root, PLAN[i % 4]) for i, root in enumerate(roots) if i % 4 in PLAN]
    firsts = {}
    for root, _ in pairs:
        firsts.setdefault(root % 3, (root, FAILED))  # the same root again, later in its shard's batch
    streams.push(pairs + list(firsts.values()))
    wait_until(lambda: spout.pending == 10, "the acker outcomes to settle")
    clock.advance(10.1)
    assert spout.check_timeouts() == 10
    streams.push([(roots[3], ACKED)])  # too late: already LOST
    wait_until(lambda: spout.stats.late_outcomes == len(firsts) + 1, "the late outcomes to be counted")
    assert spout.wait_idle(10)


def test_emit_many_draws_nonzero_ids_and_sends_one_init_columns_call(clock):
    """emit_many returns one single-root tuple per record, in order, and inits them all in one init_columns call."""
    cluster = RecordingCluster(shard_count=3)
    spout = new_spout(cluster, clock, on_outcomes=BulkRecorder())
    try:
        tracked = spout.emit_many(list("abcdef"), list(range(6)))
        assert [t.value for t in tracked] == list("abcdef")
        roots = [root_of(t) for t in tracked]
        edges = [t.message_id[r] for t, r in zip(tracked, roots)]
        assert all(roots) and all(edges) and len(set(roots)) == 6
        assert cluster.calls == [("init_columns", roots, edges, spout.name)]
        assert all(cluster.vals[r] == e for r, e in zip(roots, edges))  # the init is each tuple's edge
        assert (spout.pending, spout.stats.emitted) == (6, 6)
    finally:
        spout.close()


def test_exactly_one_bulk_callback_per_emit_under_mixed_outcomes(clock):
    """Every record gets exactly one entry in on_outcomes (ACKED, FAILED, TIMED_OUT or LOST); repeats are late."""
    cluster, bulk = RecordingCluster(shard_count=3), BulkRecorder()
    spout = new_spout(cluster, clock, on_outcomes=bulk)
    try:
        mixed_scenario(spout, cluster, clock)
    finally:
        spout.close()
    got = bulk.flat()
    assert Counter(mid for mid, _ in got) == Counter(f"m{i}" for i in range(40))
    assert dict(got) == {f"m{i}": EXPECTED[i % 4] for i in range(40)}
    stats = spout.stats
    assert (stats.acked, stats.failed, stats.timed_out, stats.lost, stats.pending) == (10, 10, 10, 10, 0)
    assert stats.emitted == stats.acked + stats.failed + stats.timed_out + stats.lost + stats.pending
    assert len(bulk.calls) < 10  # settled per batch, not per record


def test_bulk_and_per_record_callbacks_agree(clock, recorder):
    """The same emits and outcomes give the same (message id, outcome) through on_outcomes and on_ack/on_fail."""
    results = []
    for callbacks in ({"on_outcomes": BulkRecorder()}, {"on_ack": recorder.on_ack, "on_fail": recorder.on_fail}):
        cluster = RecordingCluster(shard_count=3)
        spout = new_spout(cluster, clock, **callbacks)
        try:
            mixed_scenario(spout, cluster, clock)
        finally:
            spout.close()
        results.append(spout.stats)
    recorder.assert_exactly_once(f"m{i}" for i in range(40))
    per_record = {mid: "acked" if reason is None else reason for mid, reason in recorder.calls}
    assert per_record == {f"m{i}": EXPECTED[i % 4] for i in range(40)}
    bulk_stats, record_stats = results
    assert (bulk_stats.acked, bulk_stats.failed, bulk_stats.timed_out, bulk_stats.lost, bulk_stats.late_outcomes) == (
        record_stats.acked,
        record_stats.failed,
        record_stats.timed_out,
        record_stats.lost,
        record_stats.late_outcomes,
    )


def test_max_pending_holds_across_bulk_emits(clock):
    """A bulk emit is admitted whole or not at all, try_emit_many takes the prefix that fits, a blocked one resumes."""
    cluster = RecordingCluster()
    spout = new_spout(cluster, clock, on_outcomes=BulkRecorder())
    spout.max_pending = 10
    try:
        first = spout.emit_many(range(6), range(6))
        with pytest.raises(SpoutFull):
            spout.emit_many(range(5), range(5), block=False)
        assert spout.pending == 6 and spout.stats.emitted == 6  # nothing of the refused batch
        part = spout.try_emit_many(["a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e"])
        assert [t.value for t in part] == ["a", "b", "c", "d"] and spout.pending == 10
        assert spout.try_emit_many(["x"], ["x"]) == []
        roots, edges = spout.emit_columns(["y", "z"], prefix=True)
        assert roots.size == edges.size == 0
        with pytest.raises(ValueError, match="max_pending"):
            spout.emit_many(range(11), range(11))
        done = threading.Event()
        result: list[Any] = []
        threading.Thread(target=lambda: (result.extend(spout.emit_many(range(3), range(3))), done.set())).start()
        Streams(cluster).push([(root_of(t), ACKED) for t in first[:3]])
        assert done.wait(10)
        assert len(result) == 3 and spout.pending == 10 and spout.stats.emitted == 13
    finally:
        spout.close()


def test_emit_columns_returns_the_ids_and_settles_like_emit_many(clock):
    """emit_columns returns (roots, edges) uint64 arrays; outcomes for them reach on_outcomes with the message ids."""
    cluster, bulk = RecordingCluster(shard_count=2), BulkRecorder()
    spout = new_spout(cluster, clock, on_outcomes=bulk)
    try:
        roots, edges = spout.emit_columns(np.arange(4))
        assert roots.dtype == edges.dtype == np.uint64 and roots.size == 4 and roots.all() and edges.all()
        assert cluster.calls == [("init_columns", roots.tolist(), edges.tolist(), spout.name)]
        Streams(cluster).push([(int(r), ACKED if i % 2 else FAILED) for i, r in enumerate(roots)])
        wait_until(lambda: len(bulk.flat()) == 4, "four outcomes")
    finally:
        spout.close()
    assert dict(bulk.flat()) == {0: Outcome.FAILED, 1: "acked", 2: Outcome.FAILED, 3: "acked"}


def test_a_timeout_reset_in_a_batch_restarts_that_backstop_only(clock):
    """TIMEOUT_RESET in an outcome batch gives its tree a fresh backstop; the other tree of the batch still ends LOST."""
    cluster, bulk = RecordingCluster(), BulkRecorder()
    spout = new_spout(cluster, clock, on_outcomes=bulk)
    try:
        kept, other = spout.emit_many(["k", "o"], ["kept", "other"])
        clock.advance(8.0)
        Streams(cluster).push([(root_of(kept), RESET)])
        wait_until(lambda: spout.stats.timeout_resets == 1, "the reset")
        clock.advance(2.1)
        assert spout.check_timeouts() == 1
        clock.advance(7.9)
        assert spout.check_timeouts() == 1
        assert spout.wait_idle(10)
    finally:
        spout.close()
    assert bulk.flat() == [("other", Outcome.LOST), ("kept", Outcome.LOST)]


def test_a_down_stream_pauses_only_its_shards_bulk_emitted_backstops(clock):
    """A stream outage delays only its shard's LOST verdicts, for records emitted in bulk before and after it."""
    cluster, bulk = RecordingCluster(shard_count=2), BulkRecorder()
    spout = new_spout(cluster, clock, on_outcomes=bulk)
    try:
        before, _ = spout.emit_columns(list(range(40)))
        before_on_1 = int(np.sum(before % np.uint64(2) == 1))
        assert 0 < before_on_1 < 40  # both shards hold some (odds of not: 2^-39)
        spout._on_stream_state(0, False)
        clock.advance(6.0)
        spout._on_stream_state(0, True)  # shard 0's backstop clock is now 6 s behind
        after, _ = spout.emit_columns(list(range(40, 80)))  # due 10 s from now on either shard
        clock.advance(4.1)
        assert spout.check_timeouts() == before_on_1  # the earlier batch's shard-1 records only
        assert all(int(r) in spout._pending for r in before if int(r) % 2 == 0)
        clock.advance(6.0)
        assert spout.check_timeouts() == 80 - before_on_1
        assert spout.wait_idle(10)
    finally:
        spout.close()
    assert sorted(mid for mid, _ in bulk.flat()) == list(range(80)) and spout.stats.lost == 80


def test_a_dropped_init_columns_batch_fails_its_roots_lost_at_once(clock):
    """When the client reports a dropped batch of column inits, those records end LOST without waiting."""
    cluster, bulk = RecordingCluster(), BulkRecorder()
    spout = new_spout(cluster, clock, on_outcomes=bulk)
    try:
        roots, _ = spout.emit_columns(["a", "b", "c"])
        failure = ShardFailure(0, "127.0.0.1:1", None, "down", 2, tuple(roots[:2].tolist()))
        for listener in cluster.listeners:
            listener(ShardUnavailable([failure], "test"))
        wait_until(lambda: len(bulk.flat()) == 2, "two LOST records")
        assert bulk.flat() == [("a", Outcome.LOST), ("b", Outcome.LOST)] and spout.pending == 1
    finally:
        spout.close()


def test_emit_many_swallows_a_failed_init_and_the_backstop_ends_them(clock):
    """If init_columns raises, emit_many still returns the tuples and each record ends LOST exactly once."""
    cluster, bulk = RecordingCluster(), BulkRecorder()
    cluster.init_error = ShardUnavailable([], "down")
    spout = new_spout(cluster, clock, on_outcomes=bulk)
    try:
        assert len(spout.emit_many(["a", "b"], ["a", "b"])) == 2
        clock.advance(10.1)
        assert spout.check_timeouts() == 2
        assert spout.wait_idle(10)
    finally:
        spout.close()
    assert sorted(bulk.flat()) == [("a", Outcome.LOST), ("b", Outcome.LOST)]


def test_close_fails_what_is_pending_lost_in_one_bulk_call(clock):
    """close() hands every pending record to on_outcomes as LOST, in one call."""
    cluster, bulk = RecordingCluster(), BulkRecorder()
    spout = new_spout(cluster, clock, on_outcomes=bulk)
    spout.emit_many(range(5), range(5))
    spout.close()
    assert bulk.calls == [([], [(i, Outcome.LOST) for i in range(5)])]
    assert spout.stats.lost == 5 and spout.pending == 0


def test_an_on_outcomes_error_is_logged_and_the_records_still_count_as_called_back(clock, caplog):
    """A raising on_outcomes is logged; wait_idle still returns, and later batches are still delivered."""
    cluster, seen = RecordingCluster(), []

    def on_outcomes(acked, failed):
        seen.append(len(acked))
        if len(seen) == 1:
            raise RuntimeError("user bug")

    spout = new_spout(cluster, clock, on_outcomes=on_outcomes)
    try:
        tracked = spout.emit_many(range(4), range(4))
        streams = Streams(cluster)
        streams.push([(root_of(t), ACKED) for t in tracked[:2]])
        wait_until(lambda: len(seen) == 1, "the first call")
        streams.push([(root_of(t), ACKED) for t in tracked[2:]])
        assert spout.wait_idle(10)
    finally:
        spout.close()
    assert seen == [2, 2] and "user bug" in caplog.text


def test_callbacks_are_one_style_or_the_other():
    """A spout needs on_ack and on_fail, or on_outcomes; both styles at once, or neither, is refused."""
    cluster = RecordingCluster()
    with pytest.raises(ValueError, match="not both"):
        Spout(cluster, on_ack=print, on_fail=print, on_outcomes=print, timeout=1.0)
    with pytest.raises(ValueError, match="on_outcomes"):
        Spout(cluster, on_ack=print, timeout=1.0)


def test_bulk_emit_input_is_checked(clock):
    """Records and message ids of different lengths are refused before anything is emitted."""
    cluster = RecordingCluster(shard_count=3)
    spout = new_spout(cluster, clock, on_outcomes=BulkRecorder())
    try:
        with pytest.raises(ValueError, match="one message id per record"):
            spout.emit_many([1, 2], [1])
        with pytest.raises(ValueError, match="one message id per record"):
            spout.try_emit_many([1], [])
        assert spout.emit_many([], []) == [] and cluster.calls == [] and spout.stats.emitted == 0
    finally:
        spout.close()


def test_subscription_hands_a_batch_over_as_arrays_without_the_sequences_seen():
    """deliver_batch gets numpy columns once per batch; a re-sent prefix of sequences is cut off and counted."""
    got = []
    sub = OutcomeSubscription(RecordingCluster(), 0, "s", deliver_batch=lambda *arrays: got.append(arrays))
    batch = acker_pb2.OutcomeBatch(
        incarnation=7, first_sequence=1, root_ids=[5, 6], outcomes=[ACKED, FAILED], latency_micros=[10, 20]
    )
    sub._handle(decode_outcome_batch(batch.SerializeToString()))
    again = batch.__class__(incarnation=7, first_sequence=2, root_ids=[6, 9], outcomes=[FAILED, ACKED])
    sub._handle(decode_outcome_batch(again.SerializeToString()))
    assert [a.dtype for a in got[0]] == [np.uint64, np.int32, np.uint64]
    assert [a.tolist() for a in got[0]] == [[5, 6], [ACKED, FAILED], [10, 20]]
    # The second batch has no latencies: cut to the shortest column, as zip did.
    assert len(got) == 1 and sub.duplicates_skipped == 1 and sub.last_sequence == 3


def test_random_ids_are_nonzero_and_redraw_zeros(monkeypatch):
    """random_ids draws the count asked for, uint64 and never 0, redrawing the zeros the OS returned."""
    real = columns_module.os.urandom
    reads = []

    def zeros_first(n):
        reads.append(n)
        return bytes(n) if len(reads) == 1 else real(n)

    monkeypatch.setattr(columns_module.os, "urandom", zeros_first)
    ids = random_ids(3)
    assert ids.dtype == np.uint64 and ids.size == 3 and ids.all()
    assert reads == [24, 24]
    with pytest.raises(ValueError):
        random_ids(-1)


def test_bulk_spout_against_an_acker(make_ackers, make_client):
    """Against real ackers: emit_many, ack half in columns, fail the rest; every record called back once, right."""
    servers = make_ackers(2, message_timeout=30.0)
    client = make_client([s.address for s in servers])
    bulk = BulkRecorder()
    spout = Spout(client, on_outcomes=bulk, timeout=60.0).start()
    try:
        tracked = spout.emit_many([f"r{i}" for i in range(200)], list(range(200)))
        roots = np.array([root_of(t) for t in tracked], dtype=np.uint64)
        edges = np.array([t.message_id[int(r)] for t, r in zip(tracked, roots)], dtype=np.uint64)
        client.ack_columns(roots[::2], edges[::2])
        client.fail_columns(roots[1::2])
        client.flush()
        assert spout.wait_idle(30)
    finally:
        spout.close()
    assert dict(bulk.flat()) == {i: "acked" if i % 2 == 0 else Outcome.FAILED for i in range(200)}
    assert len(bulk.flat()) == 200 and spout.stats.late_outcomes == 0
