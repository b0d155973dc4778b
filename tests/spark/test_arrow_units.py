"""The Arrow bolts' column-wise parts without Spark: the _acker_ids codecs, edge-id determinism, held acks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from acker_client import MessageId, TrackedTuple
from acker_spark.steps.arrow_bolt import ArrowBolt
from acker_spark.steps.arrow_collector import ArrowCollector
from acker_spark.steps.frames import decode_ids, pack_ids, pairs_of, unpack_ids
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StructField, StructType

X_SCHEMA = StructType([StructField("x", LongType())])  # a StructType: DDL strings need a SparkContext
ids64 = st.integers(min_value=1, max_value=2**64 - 1)
message_ids = st.dictionaries(ids64, ids64, max_size=4).map(MessageId)


class RecordingClient:
    """A stand-in for ClusterClient's columnar methods: what a commit sends."""

    def __init__(self) -> None:
        self.acks: dict[int, int] = {}
        self.fails: set[int] = set()
        self.keys: list[int] = []
        self.reasons: dict[int, str] = {}  # root -> reason the bolt's commits reported

    def ack_columns(self, roots: Any, values: Any, dedup_key: int = 0) -> None:
        self.keys.append(dedup_key)
        for root, value in zip(np.asarray(roots).tolist(), np.asarray(values).tolist()):
            self.acks[root] = self.acks.get(root, 0) ^ value

    def ack(self, root: int, value: int, dedup_key: int = 0) -> None:  # BoltCollector's per-root commit
        self.ack_columns([root], [value], dedup_key)

    def fail_columns(self, roots: Any) -> None:
        self.fails.update(np.asarray(roots).tolist())

    def reset_timeout_columns(self, roots: Any) -> None:
        pass

    def flush(self) -> None:
        pass


def tracked_batch(message_ids: list[MessageId], **columns: Any) -> pa.RecordBatch:
    """An input batch: user columns plus _acker_ids."""
    data = {**columns, "_acker_ids": pa.array([pack_ids(m) for m in message_ids], pa.binary())}
    return pa.RecordBatch.from_pydict(data)


def fan_out(counts: list[int]) -> Any:
    """An ArrowBolt function: input row i gets counts[i] children, emitted in two calls (evens, then odds)."""

    def fn(batch: pa.RecordBatch, collector: ArrowCollector) -> None:
        n = np.asarray(batch.column("n").to_pylist(), dtype=np.int64)
        parents = np.repeat(np.arange(batch.num_rows), n)
        for part in (parents[::2], parents[1::2]):
            collector.emit({"x": pa.array(part, pa.int64())}, anchors=part)

    return fn


def run_bolt(bolt: ArrowBolt, batches: list[pa.RecordBatch], client: RecordingClient) -> list[pa.RecordBatch]:
    """Run ``bolt`` over one partition's batches with ``client`` standing in for the ackers."""
    bolt.client = lambda: client  # type: ignore[method-assign]  # this bolt's executor client, replaced
    bolt.leases = False  # the stand-in answers no Describe; leases have tests of their own (test_leases.py)
    committed = bolt._commit

    def commit(collector: ArrowCollector, *args: Any, **kwargs: Any) -> None:
        client.reasons.update(collector.fail_reasons)  # what the commit reports to the driver
        committed(collector, *args, **kwargs)

    bolt._commit = commit  # type: ignore[method-assign]
    return list(bolt.run_batches(3, batches))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_two_stages_complete_every_tree(counts: list[int], rng: Any) -> None:
    """Spout ids, a fan-out stage (several emits per batch) and a sink: every root's XOR of init and acks is 0."""
    roots = list(range(1, len(counts) + 1))
    inits = {r: rng.getrandbits(64) | 1 for r in roots}
    stage1 = ArrowBolt(fan_out(counts), ["a:1"], schema=X_SCHEMA, uid=11)
    sink = ArrowBolt(lambda batch, collector: None, ["a:1"], schema=None, uid=12)
    client = RecordingClient()
    batch = tracked_batch([MessageId.single(r, inits[r]) for r in roots], n=counts)
    children = run_bolt(stage1, [batch], client)
    table = pa.Table.from_batches(children) if children else None
    if table is not None:
        shuffled = table.take(pa.array(rng.sample(range(table.num_rows), table.num_rows), pa.int64()))
        run_bolt(sink, shuffled.to_batches(max_chunksize=3), client)
        assert table.num_rows == sum(counts)
    assert all(client.acks.get(r, 0) ^ inits[r] == 0 for r in roots)
    assert client.fails == set()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(message_ids, st.lists(message_ids, min_size=1, max_size=3)), min_size=1, max_size=8),
    st.lists(st.integers(0, 11), min_size=8, max_size=8),
    ids64,
)
def test_row_bolt_and_arrow_bolt_derive_the_same_ids(parents: list[Any], counts: list[int], salt: int) -> None:
    """The same parents (single or collect_list-merged rows), salt and ordinals give the same children and acks
    whether a per-tuple BoltCollector with DeterministicEdgeIds or an ArrowCollector processes them."""
    from acker_client import BoltCollector
    from acker_spark import DeterministicEdgeIds

    packed: list[Any] = [pack_ids(p) if isinstance(p, MessageId) else [pack_ids(m) for m in p] for p in parents]
    if any(isinstance(p, list) for p in packed):  # an aggregated column: array<binary>, one list per row
        packed = [p if isinstance(p, list) else [p] for p in packed]
        column = pa.array(packed, pa.list_(pa.binary()))
    else:
        column = pa.array(packed, pa.binary())
    columnar = ArrowCollector(salt, pa.schema([("x", pa.int64())]), RecordingClient())
    columnar._start_batch(decode_ids(column))
    anchors = np.repeat(np.arange(len(parents)), counts[: len(parents)])
    columnar.emit({"x": pa.array(anchors, pa.int64())}, anchors=anchors)
    (out,) = columnar._finish_batch()
    columnar.commit(dedup_key=9)

    per_tuple = BoltCollector(RecordingClient(), edge_ids=DeterministicEdgeIds(salt), hold=True)
    tuples = [TrackedTuple(i, unpack_ids(p)) for i, p in enumerate(packed)]
    children = [per_tuple.emit(int(k), anchors=[tuples[k]]) for k in anchors.tolist()]
    for t in tuples:
        per_tuple.ack(t)
    per_tuple.commit(9)

    assert [unpack_ids(v) for v in out.column("_acker_ids").to_pylist()] == [c.message_id for c in children]
    assert {r: v for r, v in columnar.client.acks.items() if v} == {
        r: v for r, v in per_tuple.cluster.acks.items() if v
    }


def test_edge_ids_are_deterministic_and_order_independent() -> None:
    """The same parents in another order, batching and emit split get the same child ids; another uid does not."""
    parents = [MessageId.single(r, r * 7 + 1) for r in range(1, 9)]
    counts = [2, 0, 3, 1, 1, 4, 0, 2]
    first = pa.Table.from_batches(
        run_bolt(
            ArrowBolt(fan_out(counts), ["a:1"], schema=X_SCHEMA, uid=5),
            [tracked_batch(parents, n=counts)],
            RecordingClient(),
        )
    )
    order = [7, 3, 0, 5, 1, 6, 2, 4]
    again_batches = [
        tracked_batch([parents[i] for i in order[:3]], n=[counts[i] for i in order[:3]]),
        tracked_batch([parents[i] for i in order[3:]], n=[counts[i] for i in order[3:]]),
    ]
    again = pa.Table.from_batches(
        run_bolt(ArrowBolt(fan_out(counts), ["a:1"], schema=X_SCHEMA, uid=5), again_batches, RecordingClient())
    )
    other = pa.Table.from_batches(
        run_bolt(
            ArrowBolt(fan_out(counts), ["a:1"], schema=X_SCHEMA, uid=6),
            [tracked_batch(parents, n=counts)],
            RecordingClient(),
        )
    )

    def ids(table: pa.Table) -> set[bytes]:
        return set(table.column("_acker_ids").to_pylist())

    assert len(ids(first)) == sum(counts)
    assert ids(first) == ids(again)
    assert not ids(first) & ids(other)


def test_multi_root_parent_children_carry_every_root() -> None:
    """A child of a multi-root (aggregated) row gets one pair per root, all with its one edge id."""
    collector = ArrowCollector(9, pa.schema([("x", pa.int64())]), None)
    collector._start_batch(
        decode_ids(
            pa.array([[pack_ids(MessageId.single(1, 2)), pack_ids(MessageId.single(3, 4))]], pa.list_(pa.binary()))
        )
    )
    collector.emit({"x": [10, 11]}, anchors=[0, -1])
    (out,) = collector._finish_batch()
    child, unanchored = (unpack_ids(v) for v in out.column("_acker_ids").to_pylist())
    assert set(child.roots) == {1, 3} and len(set(child[r] for r in child.roots)) == 1
    assert unanchored == MessageId.EMPTY


def test_fail_and_explicit_ack_settle_rows_once() -> None:
    """fail(mask) fails those rows' trees, ack(slice) acks early, the rest are acked on return; twice is refused."""
    client = RecordingClient()
    collector = ArrowCollector(9, pa.schema([("x", pa.int64())]), client)
    collector._start_batch(pairs_of([MessageId.single(r, 100 + r) for r in (1, 2, 3, 4)]))
    collector.fail(np.array([False, True, False, False]))
    collector.ack(slice(0, 1))
    with pytest.raises(ValueError, match="already acked or failed"):
        collector.ack([1])
    with pytest.raises(ValueError, match="already acked or failed"):
        collector.emit({"x": [1]}, anchors=[0])
    collector._finish_batch()
    collector.commit(dedup_key=77)
    assert client.fails == {2}
    assert client.acks == {1: 101, 3: 103, 4: 104}
    assert client.keys == [77]


def test_emit_checks_columns_and_anchors() -> None:
    """Emitting columns that do not match the schema, or anchors out of range, raises a message naming the problem."""
    collector = ArrowCollector(9, pa.schema([("x", pa.int64())]), None)
    collector._start_batch(pairs_of([MessageId.single(1, 2)]))
    with pytest.raises(ValueError, match="missing"):
        collector.emit({"y": [1]}, anchors=[0])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        collector.emit({"x": [1]}, anchors=[1])
    with pytest.raises(ValueError, match="rows"):
        collector.emit({"x": [1, 2]}, anchors=[0, 0, 0])
    sink = ArrowCollector(9, None, None)
    with pytest.raises(ValueError, match="sink"):
        sink.emit({"x": [1]}, anchors=[0])


def test_a_failing_batch_sends_nothing_of_its_own() -> None:
    """A function that raises on a later batch (on_error='raise'): per batch, the earlier batch was committed and
    the failing one sends nothing; per task, the partition's held acks are all discarded."""

    def fn(batch: pa.RecordBatch, collector: ArrowCollector) -> None:
        if batch.column("n")[0].as_py() == 2:
            raise RuntimeError("boom")

    batches = [tracked_batch([MessageId.single(1, 5)], n=[1]), tracked_batch([MessageId.single(2, 6)], n=[2])]
    per_batch, per_task = RecordingClient(), RecordingClient()
    with pytest.raises(RuntimeError, match="boom"):
        run_bolt(ArrowBolt(fn, ["a:1"], schema=None, uid=3, on_error="raise"), batches, per_batch)
    with pytest.raises(RuntimeError, match="boom"):
        run_bolt(ArrowBolt(fn, ["a:1"], schema=None, uid=3, commit_every="task", on_error="raise"), batches, per_task)
    assert per_batch.acks == {1: 5} and len(per_batch.keys) == 1 and per_batch.keys[0] != 0
    assert per_task.acks == {} and per_task.keys == []


class DedupClient(RecordingClient):
    """A RecordingClient that drops an ack whose dedup key its root already applied, as the ackers do."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: set[tuple[int, int]] = set()

    def ack_columns(self, roots: Any, values: Any, dedup_key: int = 0) -> None:
        kept = [(r, v) for r, v in zip(np.asarray(roots).tolist(), np.asarray(values).tolist())
                if not dedup_key or (r, dedup_key) not in self.applied]  # fmt: skip
        self.applied.update((r, dedup_key) for r, _ in kept if dedup_key)
        as_u64 = [np.array(column, dtype=np.uint64) for column in ([r for r, _ in kept], [v for _, v in kept])]
        super().ack_columns(*as_u64, dedup_key)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=12), st.integers(1, 5), st.randoms(use_true_random=False))
def test_per_batch_commits_of_a_rerun_never_complete_a_tree_early(counts: list[int], cut: int, rng: Any) -> None:
    """A task re-run after it committed some batches: an exact repeat is dropped by its dedup keys (every tree
    completes once the sink acks), and a re-run that cuts its batches differently may hang a tree but never
    completes one whose children the sink has not acked."""
    roots = list(range(1, len(counts) + 1))
    inits = {r: rng.getrandbits(64) | 1 for r in roots}
    parents = [MessageId.single(r, inits[r]) for r in roots]
    batches = [tracked_batch(parents[i : i + cut], n=counts[i : i + cut]) for i in range(0, len(roots), cut)]
    client = DedupClient()
    stage1 = ArrowBolt(fan_out(counts), ["a:1"], schema=X_SCHEMA, uid=11)
    children = run_bolt(stage1, batches, client)
    rerun = run_bolt(ArrowBolt(fan_out(counts), ["a:1"], schema=X_SCHEMA, uid=11), batches, client)  # exact
    assert [b.to_pylist() for b in rerun] == [b.to_pylist() for b in children]
    shuffled = [
        tracked_batch(parents[i : i + cut + 1], n=counts[i : i + cut + 1]) for i in range(0, len(roots), cut + 1)
    ]
    exact = client.acks.copy()
    run_bolt(ArrowBolt(fan_out(counts), ["a:1"], schema=X_SCHEMA, uid=11), shuffled, client)  # cut otherwise
    with_children = [r for r in roots if counts[r - 1]]
    assert all(client.acks.get(r, 0) ^ inits[r] != 0 for r in with_children)  # no sink yet: none complete
    sink = ArrowBolt(lambda batch, collector: None, ["a:1"], schema=None, uid=12)
    finished = DedupClient()
    finished.acks = exact  # the first run and its exact repeat, then the sink: every tree completes
    if children:
        run_bolt(sink, children, finished)
    assert all(finished.acks.get(r, 0) ^ inits[r] == 0 for r in roots)


def test_empty_emits_and_row_lists_are_fine() -> None:
    """An empty emit and an empty list of rows are no-ops, not type errors."""
    collector = ArrowCollector(9, pa.schema([("x", pa.int64())]), None)
    collector._start_batch(pairs_of([MessageId.single(1, 2)]))
    collector.emit({"x": pa.array([], pa.int64())}, anchors=[])
    collector.fail([])
    collector.ack([])
    (out,) = collector._finish_batch()
    assert out.num_rows == 0


class DeadShardClient(RecordingClient):
    """A client whose flush reports an unreachable shard, as ClusterClient does after wait_for_shard."""

    def flush(self) -> None:
        from acker_client.errors import ShardFailure, ShardUnavailable

        raise ShardUnavailable([ShardFailure(1, "127.0.0.1:1", None, "down", 2, reason="timeout")], "dropped")


def test_an_unreachable_shard_at_commit_is_counted_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    """A commit whose shard is down does not fail the task (Spark would retry into the same outage): a warning names it."""
    client = DeadShardClient()
    bolt = ArrowBolt(lambda batch, collector: None, ["a:1"], schema=None, uid=3, name="sink")
    with caplog.at_level("INFO", logger="acker_spark.executor"):
        assert run_bolt(bolt, [tracked_batch([MessageId.single(1, 5)], n=[1])], client) == []
    assert client.acks == {1: 5} and client.keys  # sent, then the flush reported the shard down
    (line,) = [r for r in caplog.records if r.name == "acker_spark.executor"]
    assert line.levelname == "WARNING"
    assert "sink" in line.getMessage() and "could not deliver" in line.getMessage()
    assert "its 1 trees will fail as ACKS_UNDELIVERED" in line.getMessage()


def test_withhold_drops_the_held_rows_of_unreachable_shards() -> None:
    """An ArrowCollector's withhold(shards, n): those shards' acks and fails leave the commit, their roots returned."""
    client = RecordingClient()
    collector = ArrowCollector(9, pa.schema([("x", pa.int64())]), client)
    collector._start_batch(pairs_of([MessageId.single(r, 100 + r) for r in (3, 4, 5, 7)]))
    collector.fail(np.array([False, True, False, False]))  # root 4: shard 1 of 3
    collector._finish_batch()
    assert collector.withhold({1}, 3) == (4, 7)
    collector.commit(dedup_key=77)
    assert client.fails == set()
    assert client.acks == {3: 103, 5: 105}


def raising_on(bad: set[int]) -> Any:
    """An ArrowBolt function emitting one child per row; it raises ValueError for any batch holding a ``bad`` n."""

    def fn(batch: pa.RecordBatch, collector: ArrowCollector) -> None:
        values = batch.column("n").to_pylist()
        collector.emit({"x": pa.array(values, pa.int64())}, anchors=np.arange(batch.num_rows))
        hit = sorted(bad & set(values))
        if hit:
            raise ValueError(f"cannot handle n={hit[0]}")

    return fn


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.sets(st.integers(0, 39), max_size=4))
def test_a_raising_row_is_failed_alone_with_its_cause(rows: int, bad: set[int]) -> None:
    """on_error='isolate': the rows that raise are failed with the exception as reason; every other row's
    children are emitted once and its tree completes."""
    bad = {b for b in bad if b < rows}
    roots = list(range(1, rows + 1))
    inits = {r: r * 1_000_003 for r in roots}
    client = RecordingClient()
    bolt = ArrowBolt(raising_on(bad), ["a:1"], schema=X_SCHEMA, uid=7)
    batch = tracked_batch([MessageId.single(r, inits[r]) for r in roots], n=list(range(rows)))
    out = run_bolt(bolt, [batch], client)
    emitted = [x for b in out for x in b.column("x").to_pylist()]
    assert sorted(emitted) == [n for n in range(rows) if n not in bad]
    assert client.fails == {n + 1 for n in bad}
    sink = ArrowBolt(lambda batch, collector: None, ["a:1"], schema=None, uid=8)
    if out:
        run_bolt(sink, out, client)
    assert all(client.acks.get(r, 0) ^ inits[r] == 0 for r in roots if r - 1 not in bad)
    reasons = dict(bolt_reasons(bolt, client))
    assert set(reasons) == {n + 1 for n in bad}
    assert all(r.startswith(f"ValueError: cannot handle n={n - 1}") and " in fn)" in r for n, r in reasons.items())


def bolt_reasons(bolt: ArrowBolt, client: RecordingClient) -> list[tuple[int, str]]:
    """The (root, reason) pairs the bolt's last run reported (its collector, as the commit reads them)."""
    return list(client.reasons.items())


def test_on_error_raise_fails_the_task() -> None:
    """on_error='raise' keeps Spark's behaviour: the exception ends the task and nothing is sent."""
    client = RecordingClient()
    bolt = ArrowBolt(raising_on({1}), ["a:1"], schema=X_SCHEMA, uid=7, on_error="raise", commit_every="task")
    with pytest.raises(ValueError, match="n=1"):
        run_bolt(bolt, [tracked_batch([MessageId.single(r, r) for r in (1, 2, 3)], n=[0, 1, 2])], client)
    assert client.acks == {} and client.fails == set()


@pytest.mark.parametrize(("error", "task_fails"), [(RuntimeError, True), (ConnectionError, True), (KeyError, False)])
def test_every_row_raising_fails_the_task_unless_the_records_are_poison(error: type, task_fails: bool) -> None:
    """A batch whose every row raises a non-poison error is a failing task (Spark retries it); a poison type
    (the records themselves are bad) fails each record alone instead."""

    def fn(batch: pa.RecordBatch, collector: ArrowCollector) -> None:
        raise error("down")

    client = RecordingClient()
    bolt = ArrowBolt(fn, ["a:1"], schema=None, uid=7)
    batch = tracked_batch([MessageId.single(r, r) for r in range(1, 21)], n=list(range(20)))
    if task_fails:
        with pytest.raises(error, match="down"):
            run_bolt(bolt, [batch], client)
        assert client.fails == set() and client.acks == {}
    else:
        assert run_bolt(bolt, [batch], client) == []
        assert client.fails == set(range(1, 21))
