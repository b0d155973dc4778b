"""Executors that cannot reach the ackers: the run fails with the cause, not as a quiet stream of timeouts.

Issue 12: with the driver's client on the right addresses and the Bolts on wrong
ones, ``pipeline.run`` returned normally with every record dead-lettered as
TIMED_OUT and nothing on stderr. Now the driver learns every dropped task
commit (accumulators), the records fail as ACKS_UNDELIVERED, and the run raises.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient, MessageId, TrackedTuple
from acker_client.testing import unreachable_addresses
from acker_protocol.wire import Outcome
from acker_spark import AcksUndelivered, Bolt, DeadLetterStore, Delivery, GuaranteedPipeline, ReplayPolicy
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

ONCE = ReplayPolicy(max_attempts=1)
# The executors' client gives up on an unreachable acker at once instead of riding out a blip.
IMPATIENT = {"wait_for_shard": 0.0, "deadline": 0.5}


def split(lines: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    for line in lines:
        for word in line.value.value.split():
            yield collector.emit(word, anchors=[line])
        collector.ack(line)


def store(words: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    for word in words:
        collector.ack(word)
    return iter(())


RECORDS = [(f"r{i}", f"alpha beta {i}") for i in range(6)]


def run_misconfigured(
    spark: Any, client: ClusterClient, db: Path, wrong: list[str], **options: Any
) -> tuple[GuaranteedPipeline, list[Outcome]]:
    """The issue's job: driver client right, Bolts on ``wrong``; return the pipeline and the callbacks seen."""
    split_bolt = Bolt(split, wrong, name="split", client_options=IMPATIENT)
    store_bolt = Bolt(store, wrong, name="store", client_options=IMPATIENT)
    seen: list[Outcome] = []
    pipeline = GuaranteedPipeline(
        spark,
        client,
        dead_letters=DeadLetterStore(db),
        policy=ONCE,
        partitions=2,
        on_outcome=lambda _delivery, outcome: seen.append(outcome),
        **options,
    )
    try:
        pipeline.run(RECORDS, lambda rdd: store_bolt.apply(split_bolt.apply(rdd)).count())
    finally:
        pipeline.stats.replayed_keys.clear()
    return pipeline, seen


def test_bolts_on_dead_addresses_fail_the_run_with_the_cause(spark: Any, client: ClusterClient, tmp_path: Path) -> None:
    wrong = unreachable_addresses(3)
    with pytest.raises(AcksUndelivered) as raised:
        run_misconfigured(spark, client, tmp_path / "dead.sqlite", wrong)
    error = raised.value
    assert "could not deliver their acks" in str(error)
    assert any(a in str(error) for a in wrong)  # an address the executors could not reach
    assert error.stats.acked == 0
    assert error.stats.acks_undelivered == len(RECORDS)
    assert error.stats.timed_out == 0
    assert error.stats.commit_errors.get("split", 0) >= 1
    dead = DeadLetterStore(tmp_path / "dead.sqlite").all()
    assert {d.key for d in dead} == {k for k, _ in RECORDS}
    assert {d.reason for d in dead} == {Outcome.ACKS_UNDELIVERED}


def test_warn_mode_returns_the_stats_and_logs_the_cause(
    spark: Any, client: ClusterClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = unreachable_addresses(3)
    with caplog.at_level(logging.WARNING, logger="acker_spark.driver_fed.pipeline"):
        pipeline, seen = run_misconfigured(spark, client, tmp_path / "dead.sqlite", wrong, on_undelivered="warn")
    assert pipeline.stats.acks_undelivered == len(RECORDS)
    assert pipeline.stats.as_dict()["commit_errors"] >= 1
    assert seen == [Outcome.ACKS_UNDELIVERED] * len(RECORDS)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("could not deliver their acks" in m and any(a in m for a in wrong) for m in warnings)


def test_a_dropped_commit_is_a_warning_in_the_executor_log(caplog: pytest.LogCaptureFixture) -> None:
    """Run outside Spark: the task's log line names the shard it could not reach, at WARNING."""
    wrong = unreachable_addresses(1)
    bolt = Bolt(store, wrong, name="store", client_options=IMPATIENT)
    tuples = [TrackedTuple(Delivery("k", "v", 1), MessageId({12345: 7}))]
    with caplog.at_level(logging.WARNING, logger="acker_spark.executor"):
        assert list(bolt.run_partition(0, tuples)) == []
    (line,) = [r for r in caplog.records if r.name == "acker_spark.executor"]
    assert line.levelno == logging.WARNING
    assert wrong[0] in line.getMessage() and "could not deliver" in line.getMessage()


def test_on_undelivered_is_checked() -> None:
    with pytest.raises(ValueError, match="on_undelivered"):
        GuaranteedPipeline(_FakeSpark(), None, on_undelivered="ignore")  # type: ignore[arg-type]


class _FakeSpark:
    defaultParallelism = 2


# -- the streaming source (its planner's book alone, no Spark) ----------------------


def test_stream_commit_errors_reach_the_planner_through_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query's driver journals its bolts' dropped acks in the checkpoint; the planner's book then names ACKS_UNDELIVERED.

    The stream's planner runs in a process of its own: what the ``foreachBatch``
    function records must reach it through the checkpoint, also after the tree's
    timeout was settled.
    """
    import numpy as np
    from acker_client.testing import ManualClock
    from acker_spark import CommitErrors, record_commit_errors
    from acker_spark.executor_read.book import ReplayBook
    from acker_spark.executor_read.checkpoint import Checkpoint
    from acker_spark.executor_read.emission_log import Emissions
    from acker_spark.executor_read.identity import derive_roots
    from acker_spark.steps import step as step_module

    checkpoint = tmp_path / "acker-checkpoint"
    book = ReplayBook(Checkpoint(checkpoint), 7, ONCE, ManualClock())
    idents, attempts = np.array([11, 12], dtype=np.uint64), np.ones(2, dtype=np.uint16)
    roots = derive_roots(7, idents, attempts)
    order = np.argsort(roots)
    book.add_round(Emissions(roots[order], idents[order], attempts[order], 0), 1)
    book.settle_outcomes(roots, np.full(2, int(Outcome.TIMED_OUT), dtype=np.int8))
    dropped = int(roots[0])  # record 11's acks "could not be delivered"
    report = CommitErrors("store", 1, frozenset([dropped]), ("shard 0 at 10.0.0.9:7100: UNAVAILABLE: no route",))
    monkeypatch.setattr(step_module, "commit_errors", lambda: {"store": report})
    assert record_commit_errors(checkpoint) == {"store": 1}
    assert record_commit_errors(checkpoint) == {"store": 1}  # reported again: journaled once
    assert Checkpoint(checkpoint).read_undelivered().tolist() == [dropped]
    book.reload_undelivered()
    store = DeadLetterStore(tmp_path / "dead.sqlite")
    table = book.table
    book.write_dead_letters(
        store, lambda dead: [(str(table.idents[p]), None, Outcome(int(table.reason[p])), 1) for p in dead]
    )
    assert {d.key: d.reason for d in store.all()} == {"11": Outcome.ACKS_UNDELIVERED, "12": Outcome.TIMED_OUT}
