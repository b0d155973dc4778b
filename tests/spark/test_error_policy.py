"""GuaranteedPipeline's error policy per exception type: a TimeoutError record is retried, a ValueError one is not.

Reproduced before: the driver-fed pipeline retried every failure up to
``max_attempts`` whatever its cause, so a malformed record (ValueError) ran
``max_attempts`` times before its dead letter, exactly like a record whose
service timed out once. Now the pipeline asks the same ``ReplayPolicy`` as
SourcePipeline's book (tests/spark/test_source_poison.py): poison types are
dead-lettered at once, other exceptions retried, and ``retry_on`` turns the
rule into a whitelist.
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
from acker_spark import Bolt, DeadLetterStore, GuaranteedPipeline, RecordsFailed, ReplayPolicy, close_clients
from acker_spark.budget import BudgetExceeded
from pyspark import cloudpickle

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


def parse(lines: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    """k07 is malformed (ValueError, every attempt); k13's service times out on its first attempt only."""
    for line in lines:
        if line.value.key == "k07":
            raise ValueError("amount of k07 is not a number: 'n/a'")
        if line.value.key == "k13" and line.value.attempt == 1:
            raise TimeoutError("pricing service timed out for k13")
        collector.ack(line)
    return iter(())


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


def attempts_by_key(outcomes: list[tuple[str, int, Outcome]]) -> dict[str, list[tuple[int, Outcome]]]:
    seen: dict[str, list[tuple[int, Outcome]]] = {}
    for key, attempt, outcome in outcomes:
        seen.setdefault(key, []).append((attempt, outcome))
    return seen


@pytest.mark.parametrize("fn", [parse, refuse], ids=["raised", "failed-with-reason"])
def test_a_timeout_record_is_retried_and_a_value_error_record_is_not(
    spark: Any, patient_ackers: Any, tmp_path: Path, fn: Any
) -> None:
    ackers = patient_ackers
    bolt = Bolt(fn, ackers.addresses, name=fn.__name__)
    outcomes: list[tuple[str, int, Outcome]] = []
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    with ClusterClient(ackers.addresses) as client:
        pipeline = GuaranteedPipeline(
            spark,
            client,
            partitions=2,
            policy=POLICY,
            dead_letters=letters,
            on_outcome=lambda d, o: outcomes.append((d.key, d.attempt, o)),
        )
        if fn is parse:  # a record convicted by a job error is reported by RecordsFailed
            with pytest.raises(RecordsFailed) as raised:
                pipeline.run(RECORDS, lambda rdd: bolt.apply(rdd).count())
            stats = raised.value.stats
        else:
            stats = pipeline.run(RECORDS, lambda rdd: bolt.apply(rdd).count())
    (dead,) = letters.all()
    assert (dead.key, dead.reason, dead.attempts) == ("k07", Outcome.FAILED, 1)  # not retried
    assert dead.cause is not None and dead.cause.startswith("ValueError: amount of k07 is not a number")
    seen = attempts_by_key(outcomes)
    assert seen["k13"][-1] == (2, Outcome.ACKED)  # retried once, then acked
    assert (stats.acked, stats.dead_lettered) == (len(RECORDS) - 1, 1)


def test_retry_on_is_a_whitelist(spark: Any, patient_ackers: Any, tmp_path: Path) -> None:
    """With retry_on={"ValueError"} the malformed record is retried to max_attempts; the TimeoutError is not."""
    ackers = patient_ackers
    bolt = Bolt(refuse, ackers.addresses, name="refuse")
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    policy = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2, retry_on={"ValueError"})
    with ClusterClient(ackers.addresses) as client:
        pipeline = GuaranteedPipeline(spark, client, partitions=2, policy=policy, dead_letters=letters)
        stats = pipeline.run(RECORDS, lambda rdd: bolt.apply(rdd).count())
    assert {d.key: d.attempts for d in letters.all()} == {"k07": 3, "k13": 1}
    assert stats.dead_lettered == 2


def reject_fifth(lines: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    """Every fifth record is malformed: failed with a ValueError reason."""
    for line in lines:
        if int(line.value.key[1:]) % 5 == 0:
            collector.fail(line, f"ValueError: amount of {line.value.key} is not a number: 'n/a'")
        else:
            collector.ack(line)
    return iter(())


def test_the_failure_budget_stops_the_run_after_the_job_that_passed_it(
    spark: Any, patient_ackers: Any, tmp_path: Path
) -> None:
    """20% of 2,000 records fail with a ValueError: the run stops after its first job of 100, naming the cause."""
    ackers = patient_ackers
    bolt = Bolt(reject_fifth, ackers.addresses, name="reject_fifth")
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    records = [(f"k{i:04d}", f"amount {i}") for i in range(2_000)]
    with ClusterClient(ackers.addresses) as client:
        pipeline = GuaranteedPipeline(spark, client, max_pending=100, partitions=2, policy=POLICY, dead_letters=letters)
        with pytest.raises(BudgetExceeded) as raised:
            pipeline.run(records, lambda rdd: bolt.apply(rdd).count())
    error = raised.value
    assert error.read <= 200 and error.dead == len(letters.all()) >= 6  # the source was not read further
    (top,) = error.causes
    assert (top.kind, top.count) == ("ValueError", error.dead)
    assert top.example_cause == f"ValueError: amount of {top.example_key} is not a number: 'n/a'"
    assert int(top.example_key[1:]) % 5 == 0 and error.stats.emitted == error.read
