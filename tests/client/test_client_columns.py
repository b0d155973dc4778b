"""Columnar operations: OpBuffer's columnar adds against its per-call ones, and ClusterClient's *_columns methods."""

from __future__ import annotations

import numpy as np
import pytest
from acker_client import new_id
from acker_client.batching import ACK, FAIL, INIT, RESET_TIMEOUT, OpBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from .test_batching import _validate

root = st.integers(min_value=1, max_value=8)  # few roots: folding and repeats happen
value = st.integers(min_value=0, max_value=(1 << 64) - 1)
op = st.one_of(
    st.tuples(st.just(INIT), root, value, st.sampled_from(["a", "b"])),
    st.tuples(st.just(ACK), root, value, st.sampled_from([0, 0, 11, 12])),
    st.tuples(st.just(FAIL), root, st.just(0), st.just(0)),
    st.tuples(st.just(RESET_TIMEOUT), root, st.just(0), st.just(0)),
)


def _canonical(request):
    keys = list(request.dedup_keys) or [0] * len(request.kinds)
    index = list(request.spout_index) or [0] * len(request.kinds)
    spouts = list(request.spouts)
    return sorted(
        (k, r, v, key, spouts[i] if k == INIT else "")
        for k, r, v, key, i in zip(request.kinds, request.root_ids, request.values, keys, index)
    )


def _add_scalar(buf, kind, r, v, tag):
    if kind == INIT:
        buf.init(r, v, tag)
    elif kind == ACK:
        buf.ack(r, v, tag)
    elif kind == FAIL:
        buf.fail(r)
    else:
        buf.reset_timeout(r)


def _add_column(buf, kind, r, v, tag):
    roots, values = np.array([r], np.uint64), np.array([v], np.uint64)
    if kind == INIT:
        buf.add_columns(INIT, roots, values, spout=tag)
    elif kind == ACK:
        buf.add_columns(ACK, roots, values, dedup_key=tag)
    else:
        buf.add_columns(kind, roots)


@settings(max_examples=300)
@given(st.lists(st.tuples(op, st.booleans()), max_size=30), st.sampled_from([0, 99]))
def test_columns_encode_the_same_operations_as_calls(ops, batch_key):
    """Any mix of per-call and columnar adds sends the same folded operations as all per-call adds."""
    calls, mixed = OpBuffer(), OpBuffer()
    for (kind, r, v, tag), as_column in ops:
        _add_scalar(calls, kind, r, v, tag)
        (_add_column if as_column else _add_scalar)(mixed, kind, r, v, tag)
    mixed.add_columns(ACK, np.array([5], np.uint64), np.array([0], np.uint64))  # a zero ack: sends nothing
    expected, got = calls.to_request(batch_key), mixed.to_request(batch_key)
    assert _canonical(got) == _canonical(expected)
    _validate(got)


def test_columnar_request_orders_kinds_init_fail_ack_reset():
    """INITs, then FAILs, then ACKs, then RESETs: a batch's fail wins over acks that would complete the tree."""
    buf = OpBuffer()
    two = np.array([1, 2], np.uint64)
    buf.add_columns(RESET_TIMEOUT, two)
    buf.add_columns(ACK, two, two)
    buf.add_columns(FAIL, two)
    buf.add_columns(INIT, two, two, spout="s")
    assert list(buf.to_request().kinds) == [INIT, INIT, FAIL, FAIL, ACK, ACK, RESET_TIMEOUT, RESET_TIMEOUT]


class TestClusterClientColumns:
    def test_trees_started_and_completed_in_columns_end_acked(self, make_ackers, make_client):
        """10,000 trees over 3 shards: init_columns makes them pending, ack_columns completes every one."""
        servers = make_ackers(3, message_timeout=60.0)
        client = make_client([s.address for s in servers])
        roots = np.array([new_id() for _ in range(10_000)], dtype=np.uint64)
        edges = np.array([new_id() for _ in range(10_000)], dtype=np.uint64)
        client.init_columns(roots, edges, "columns")
        client.flush()
        assert sum(client.describe(i).pending_trees for i in range(3)) == 10_000
        # Ack in two halves that XOR to the edge: folding per root must combine them.
        halves = np.array([new_id() for _ in range(10_000)], dtype=np.uint64)
        client.ack_columns(np.concatenate((roots, roots)), np.concatenate((halves, halves ^ edges)))
        client.flush()
        assert [client.describe(i).pending_trees for i in range(3)] == [0, 0, 0]
        stats = client.stats
        assert stats.applied == 20_000 and stats.batches_failed == 0
        # Batches of up to column_batch_size, not batch_size: far fewer than 20,000 / 512 requests.
        assert stats.batches_sent <= 12

    def test_keyed_column_acks_are_applied_once(self, make_ackers, make_client):
        """The same keyed ack column sent twice is applied once per tree (a re-run task's commit)."""
        (server,) = make_ackers(1, message_timeout=60.0)
        client = make_client([server.address])
        roots = np.array([new_id() for _ in range(100)], dtype=np.uint64)
        client.init_columns(roots, roots, "keyed")
        client.ack_columns(roots, np.ones(100, np.uint64), dedup_key=42)
        client.flush()
        client.ack_columns(roots, np.ones(100, np.uint64), dedup_key=42)
        client.flush()
        assert client.stats.deduplicated == 100
        assert client.describe(0).pending_trees == 100

    def test_fail_columns_fail_every_tree(self, make_ackers, make_client, make_spout, recorder):
        """Failing a column of roots reaches each tree's spout as FAILED, once per tree."""
        servers = make_ackers(2, message_timeout=60.0)
        client = make_client([s.address for s in servers])
        spout = make_spout(client)
        tuples = [spout.emit(i, i) for i in range(50)]
        client.flush()
        client.fail_columns(np.array([t.message_id.roots[0] for t in tuples] * 2, dtype=np.uint64))
        client.flush()
        assert recorder.wait_for(50)
        recorder.assert_exactly_once(range(50))
        assert {recorder.outcome(i).name for i in range(50)} == {"FAILED"}

    def test_bad_columns_are_refused_before_anything_is_buffered(self, make_ackers, make_client):
        """A zero root or mismatched lengths raise ValueError and leave the buffers empty."""
        (server,) = make_ackers(1)
        client = make_client([server.address])
        with pytest.raises(ValueError, match="root id at position 1 is 0"):
            client.ack_columns([5, 0], [1, 2])
        with pytest.raises(ValueError, match="2 root ids but 1 values"):
            client.init_columns([5, 6], [1], "s")
        with pytest.raises(ValueError, match="spout name"):
            client.init_columns([5], [1], "")
        client.flush()
        assert client.stats.operations_sent == 0
