"""An ArrowBolt's isolation of raising rows, without Spark: what it costs, that it stays exact, what it logs.

Reproduced before: the bolt re-ran halves of a batch until each raising row was
alone, so a batch with k raising rows was handed to the function about
log2(k)+2 times (200,000 rows with 0.1% raising: 2.8x the rows) and every
raising row logged a warning line of its own.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from acker_client import MessageId, new_id
from acker_spark.steps.arrow_bolt import ArrowBolt
from acker_spark.steps.arrow_collector import ArrowCollector
from acker_spark.steps.isolation import FailureRate

from .test_arrow_units import X_SCHEMA, RecordingClient, run_bolt, tracked_batch


class CountingRaiser:
    """Emits one child per row; raises ValueError naming the first ``bad`` n of a batch; counts rows handed."""

    def __init__(self, bad: set[int]) -> None:
        self.bad = np.asarray(sorted(bad), dtype=np.int64)
        self.handed = 0
        self.returned: list[int] = []  # the n of every row in a call that returned

    def __call__(self, batch: pa.RecordBatch, collector: ArrowCollector) -> None:
        self.handed += batch.num_rows
        values = batch.column("n").to_numpy()
        collector.emit({"x": pa.array(values, pa.int64())}, anchors=np.arange(batch.num_rows))
        hit = values[np.isin(values, self.bad)]
        if len(hit):
            raise ValueError(f"cannot handle n={hit[0]}")
        self.returned.extend(values.tolist())


def batches_of(rows: int, size: int) -> tuple[list[pa.RecordBatch], dict[int, int]]:
    """``rows`` input rows (n = 0..rows-1, root n+1) in batches of ``size``; each root's init value."""
    inits = {n + 1: (n + 1) * 1_000_003 for n in range(rows)}
    batches = [
        tracked_batch(
            [MessageId.single(n + 1, inits[n + 1]) for n in range(start, min(rows, start + size))],
            n=list(range(start, min(rows, start + size))),
        )
        for start in range(0, rows, size)
    ]
    return batches, inits


@pytest.mark.parametrize(("fraction", "rows", "bound"), [(0.001, 60_000, 1.2), (0.01, 10_000, 1.5)])
def test_raising_rows_cost_about_themselves_and_isolation_stays_exact(fraction: float, rows: int, bound: float) -> None:
    """Batches of 2,000 rows, a fraction raising: the function is handed at most 1.2x the rows at 0.1% (1.5x at
    1%); each raising row is failed once with its cause, every other row returned once and acked."""
    rng = np.random.default_rng(7)
    bad = set(rng.choice(rows, size=int(rows * fraction), replace=False).tolist())
    fn = CountingRaiser(bad)
    client = RecordingClient()
    bolt = ArrowBolt(fn, ["a:1"], schema=X_SCHEMA, uid=new_id())
    batches, inits = batches_of(rows, 2_000)
    out = run_bolt(bolt, batches, client)
    assert fn.handed <= bound * rows, f"{fn.handed:,} rows handed for {rows:,}"
    assert sorted(fn.returned) == [n for n in range(rows) if n not in bad]  # each good row once
    assert sorted(x for b in out for x in b.column("x").to_pylist()) == sorted(fn.returned)
    assert client.fails == {n + 1 for n in bad}
    assert set(client.reasons) == {n + 1 for n in bad}
    assert all(client.reasons[n + 1].startswith(f"ValueError: cannot handle n={n}") for n in bad)
    sink = ArrowBolt(lambda batch, collector: None, ["a:1"], schema=None, uid=new_id())
    run_bolt(sink, out, client)
    assert all(client.acks.get(r, 0) ^ inits[r] == 0 for r in inits if r - 1 not in bad)
    assert len(out) <= len(batches)  # a sliced batch hands one output batch downstream, not one per slice


def test_a_batch_without_failures_seen_runs_in_one_call() -> None:
    """No row has raised: after a bolt's first 10,000 rows in a worker (growing slices), a batch is one call;
    a rate of 0.1% slices at 100 rows."""
    fn = CountingRaiser(set())
    calls: list[int] = []

    def counted(batch: pa.RecordBatch, collector: ArrowCollector) -> None:
        calls.append(batch.num_rows)
        fn(batch, collector)

    batches, _ = batches_of(30_000, 10_000)
    out = run_bolt(ArrowBolt(counted, ["a:1"], schema=X_SCHEMA, uid=new_id()), batches, RecordingClient())
    assert calls == [500, 500, 1_000, 2_000, 4_000, 2_000, 10_000, 10_000]
    assert [b.num_rows for b in out] == [10_000, 10_000, 10_000]
    rate = FailureRate()
    rate.record(10_000, 0)
    assert rate.slice_rows(10_000) == 10_000
    rate.record(10_000, 20)
    assert rate.slice_rows(10_000) == 100
    assert rate.slice_rows(40) == 40


def test_one_log_line_per_batch_not_per_raising_row(caplog: pytest.LogCaptureFixture) -> None:
    """Two batches with 5 and 3 raising rows: two warning lines, each with the counts, types and the first cause."""
    fn = CountingRaiser({3, 10, 200, 511, 900, 1_002, 1_500, 1_999})
    batches, _ = batches_of(2_000, 1_000)
    with caplog.at_level(logging.WARNING, logger="acker_spark.executor"):
        run_bolt(ArrowBolt(fn, ["a:1"], schema=X_SCHEMA, uid=new_id(), name="parse"), batches, RecordingClient())
    lines = [r.getMessage() for r in caplog.records if r.name == "acker_spark.executor"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("bolt parse: 5 of 1000 rows of a batch raised and were failed alone (ValueError x5;")
    assert "the first: ValueError: cannot handle n=3 (at " in lines[0]
    assert lines[1].startswith("bolt parse: 3 of 1000 rows of a batch raised")


def test_a_function_returning_a_value_is_a_mistake_not_a_raising_row() -> None:
    """A function that returns something instead of emitting fails the task with a message, whatever the rate."""

    def returns(batch: pa.RecordBatch, collector: ArrowCollector) -> Any:
        return batch

    batches, _ = batches_of(10, 10)
    with pytest.raises(TypeError, match="must emit with collector.emit"):
        run_bolt(ArrowBolt(returns, ["a:1"], schema=X_SCHEMA, uid=new_id()), batches, RecordingClient())


def test_a_vectorised_function_fails_its_bad_rows_itself_and_runs_once() -> None:
    """collector.fail(rows, reason=exception): one call per batch, each bad row failed with its exception's type,
    message and place as its cause (what the replay policy reads), the others acked."""
    calls: list[int] = []

    def parse(batch: pa.RecordBatch, collector: ArrowCollector) -> None:
        calls.append(batch.num_rows)
        values = batch.column("n").to_numpy()
        bad = np.flatnonzero(values % 100 == 7)
        errors = []
        for n in values[bad]:
            try:
                raise ValueError(f"amount of n={n} is not a number")
            except ValueError as err:
                errors.append(err)
        collector.fail(bad, reason=errors)
        good = np.flatnonzero(values % 100 != 7)
        collector.emit({"x": pa.array(values[good], pa.int64())}, anchors=good)

    client = RecordingClient()
    batches, inits = batches_of(1_000, 500)
    run_bolt(ArrowBolt(parse, ["a:1"], schema=X_SCHEMA, uid=new_id()), batches, client)
    assert calls == [500, 500]
    assert client.fails == {n + 1 for n in range(7, 1_000, 100)}
    assert all(
        client.reasons[n + 1].startswith(f"ValueError: amount of n={n} is not a number (at ")
        for n in range(7, 1_000, 100)
    )


def test_a_half_known_to_raise_is_halved_without_being_called_whole() -> None:
    """100 rows, the last raising: each first half returns, so each second half is halved without a call of its
    own (it could only raise again); 8 calls where calling every half would take 14."""
    fn = CountingRaiser({99})
    calls: list[tuple[int, int]] = []

    def counted(batch: pa.RecordBatch, collector: ArrowCollector) -> None:
        values = batch.column("n").to_numpy()
        calls.append((int(values[0]), int(values[-1]) + 1))
        fn(batch, collector)

    client = RecordingClient()
    batches, _ = batches_of(100, 100)
    out = run_bolt(ArrowBolt(counted, ["a:1"], schema=X_SCHEMA, uid=new_id()), batches, client)
    assert calls == [(0, 100), (0, 50), (50, 75), (75, 88), (88, 94), (94, 97), (97, 99), (99, 100)]
    assert client.fails == {100}
    assert sorted(x for b in out for x in b.column("x").to_pylist()) == list(range(99))
