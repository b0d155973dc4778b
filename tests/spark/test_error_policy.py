"""The error policy per exception type for records a bolt fails with a reason: TimeoutError retried, ValueError not.

A bolt that fails a record with ``collector.fail(t, "Type: message")`` gives
its cause to ``ReplayPolicy``: poison types are dead-lettered at once, other
exceptions retried, and ``retry_on`` turns the rule into a whitelist. Records
whose processing *raises* are tests/spark/test_source_poison.py's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient, TrackedTuple
from acker_client.testing import local_cluster
from acker_protocol.wire import Outcome
from acker_spark import Bolt, DeadLetterStore, ReplayPolicy, SourcePipeline, close_clients
from pyspark import cloudpickle

from .test_rdd_bolts import deliveries

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

RECORDS = [(f"k{i:02d}", f"amount {i}") for i in range(40)]
POLICY = ReplayPolicy(max_attempts=4, backoff_base=0.05, backoff_cap=0.2)


@pytest.fixture
def patient_ackers() -> Iterator[Any]:
    """Ackers whose trees outlive a slow job on a loaded machine: only the bolts fail trees here."""
    with local_cluster(3, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


def refuse(lines: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    """The same two records, failed by the bolt with a reason instead of raising."""
    for line in lines:
        if line.value.key == "k07":
            collector.fail(line, "ValueError: amount of k07 is not a number: 'n/a'")
        elif line.value.key == "k13" and line.value.attempt == 1:
            collector.fail(line, "TimeoutError: pricing service timed out for k13")
        else:
            collector.ack(line)
    return iter(())


def run_refuse(spark: Any, ackers: Any, tmp_path: Path, policy: ReplayPolicy) -> tuple[Any, DeadLetterStore]:
    """``refuse`` over RECORDS through a SourcePipeline (RDD bolt); the stats and the dead letters."""
    bolt = Bolt(refuse, ackers.addresses, name="refuse")
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    with ClusterClient(ackers.addresses) as client:
        pipeline = SourcePipeline(
            spark, client, tmp_path / "checkpoint", policy=policy, dead_letters=letters, progress=None
        )
        stats = pipeline.run(RECORDS, lambda df: bolt.apply(deliveries(df)).count())
    return stats, letters


def test_a_timeout_record_is_retried_and_a_value_error_record_is_not(
    spark: Any, patient_ackers: Any, tmp_path: Path
) -> None:
    stats, letters = run_refuse(spark, patient_ackers, tmp_path, POLICY)
    (dead,) = letters.all()
    assert (dead.key, dead.reason, dead.attempts) == ("k07", Outcome.FAILED, 1)  # not retried
    assert dead.cause is not None and dead.cause.startswith("ValueError: amount of k07 is not a number")
    # k13 failed once, was retried and acked: the run's only replay.
    assert (stats.acked, stats.dead_lettered, stats.replayed, stats.failed) == (len(RECORDS) - 1, 1, 1, 2)


def test_retry_on_is_a_whitelist(spark: Any, patient_ackers: Any, tmp_path: Path) -> None:
    """With retry_on={"ValueError"} the malformed record is retried to max_attempts; the TimeoutError is not."""
    policy = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2, retry_on={"ValueError"})
    stats, letters = run_refuse(spark, patient_ackers, tmp_path, policy)
    assert {d.key: d.attempts for d in letters.all()} == {"k07": 3, "k13": 1}
    assert stats.dead_lettered == 2
