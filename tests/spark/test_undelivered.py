"""Executors that cannot reach the ackers, or reach them in the wrong order: what a task says, and the stream's book.

A task whose commit cannot be delivered logs the shard it could not reach; a
task given the ackers out of shard order refuses to run, naming the fix. How
SourcePipeline's run ends in those cases is tests/spark/test_source_undelivered.py's.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterMisconfigured, MessageId, TrackedTuple
from acker_client.testing import unreachable_addresses
from acker_protocol.wire import Outcome
from acker_spark import Bolt, DeadLetterStore, Delivery, ReplayPolicy
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

ONCE = ReplayPolicy(max_attempts=1)
# The executors' client gives up on an unreachable acker at once instead of riding out a blip.
IMPATIENT = {"wait_for_shard": 0.0, "deadline": 0.5}


def store(words: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    for word in words:
        collector.ack(word)
    return iter(())


def test_an_executor_checks_the_shard_order_as_the_driver_does(ackers: Any) -> None:
    """Outside Spark: a Bolt's task over addresses out of shard order raises, naming the position and the fix."""
    wrong = list(reversed(ackers.addresses))
    bolt = Bolt(store, wrong, name="store")
    tuples = [TrackedTuple(Delivery("k", "v", 1), MessageId({12345: 7}))]
    with pytest.raises(ClusterMisconfigured, match=r"step 'store': address 0 .* is acker shard 2 of 3.*shard order"):
        list(bolt.run_partition(0, tuples))


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
    from acker_spark.steps import step as step_module
    from acker_spark.tracking.book import ReplayBook
    from acker_spark.tracking.checkpoint import Checkpoint
    from acker_spark.tracking.emission_log import Emissions
    from acker_spark.tracking.identity import derive_roots

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
    book.write_dead_letters(
        store, lambda dead: [(str(i), None, Outcome(int(r)), 1) for i, r in zip(dead.idents, dead.reasons)]
    )
    assert {d.key: d.reason for d in store.all()} == {"11": Outcome.ACKS_UNDELIVERED, "12": Outcome.TIMED_OUT}
