"""Issue 23, case 1: one record whose processing raises costs one record, not the batch it shared.

Reproduced on main: a ``store`` bolt raising ValueError for one key of 306
dead-lettered 199 records, every row ``FAILED`` with no error text, and
``run()`` returned normally. Now the failed job's records are replayed in
halves (no attempt charged) until the raising one runs alone; it alone is
dead-lettered, with the exception's type, message and place.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient, TrackedTuple
from acker_client.testing import local_cluster
from acker_protocol.wire import Outcome
from acker_spark import (
    Bolt,
    DeadLetter,
    DeadLetterStore,
    Delivery,
    GuaranteedPipeline,
    RecordsFailed,
    ReplayPolicy,
    close_clients,
)
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

POISON = "b.txt:2"
RECORDS = [(f"{'ab'[i // 153]}.txt:{i % 153 + 1}", f"alpha beta {i}") for i in range(306)]
QUICK = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2)


def split(lines: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    for line in lines:
        for word in line.value.value.split():
            yield collector.emit((line.value.key, word), anchors=[line])
        collector.ack(line)


def store(words: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    for word in words:
        key, _ = word.value
        if key == POISON:
            raise ValueError(f"cannot store {key}")
        collector.ack(word)
    return iter(())


@pytest.fixture
def patient_ackers() -> Iterator[Any]:
    """Ackers whose trees outlive a slow job on a loaded machine: no timeout may charge an innocent record here."""
    with local_cluster(3, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


def test_one_raising_record_in_306_is_dead_lettered_alone_with_its_exception(
    spark: Any, patient_ackers: Any, tmp_path: Path
) -> None:
    ackers = patient_ackers
    client = ClusterClient(ackers.addresses)
    split_bolt = Bolt(split, ackers.addresses, name="split")
    store_bolt = Bolt(store, ackers.addresses, name="store")
    outcomes: dict[str, list[tuple[int, Outcome]]] = {}
    letters: list[DeadLetter] = []
    lock = threading.Lock()

    def on_outcome(delivery: Delivery, outcome: Outcome) -> None:
        with lock:
            outcomes.setdefault(delivery.key, []).append((delivery.attempt, outcome))

    def job(rdd: Any) -> None:
        store_bolt.apply(split_bolt.apply(rdd).repartition(3)).count()

    store_db = DeadLetterStore(tmp_path / "dead.sqlite")
    pipeline = GuaranteedPipeline(
        spark,
        client,
        partitions=4,
        policy=QUICK,
        dead_letters=store_db,
        on_outcome=on_outcome,
        on_dead_letter=letters.append,
    )
    with client, pytest.raises(RecordsFailed) as raised:  # a record was dead-lettered because a job raised
        pipeline.run(RECORDS, job)
    stats = raised.value.stats

    (dead,) = store_db.all()
    assert raised.value.causes == [dead.cause] and raised.value.stopped is None
    assert "1 records dead-lettered, because a job raised: ValueError: cannot store b.txt:2" in str(raised.value)
    # A ValueError is poison: dead-lettered on its first conviction, not replayed max_attempts times.
    assert (dead.key, dead.reason, dead.attempts) == (POISON, Outcome.FAILED, 1)
    assert dead.cause is not None and dead.cause.startswith(f"ValueError: cannot store {POISON} (at ")
    assert "test_poison.py:" in dead.cause and dead.cause.endswith(" in store)")
    assert [(d.key, d.cause) for d in letters] == [(POISON, dead.cause)]
    assert (stats.emitted, stats.acked, stats.dead_lettered) == (306, 305, 1)
    innocent = {key: seq for key, seq in outcomes.items() if key != POISON}
    assert len(innocent) == 305 and all(seq[-1] == (1, Outcome.ACKED) for seq in innocent.values())
    # No innocent record was charged an attempt, however often it was replayed.
    assert {attempt for seq in innocent.values() for attempt, _ in seq} == {1}


def reject_odd(lines: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    for line in lines:
        number = int(line.value.value.rsplit(" ", 1)[1])
        if number % 2:
            collector.fail(line, f"odd number {number}")
        else:
            collector.ack(line)
    return iter(())


def test_the_reason_given_to_collector_fail_is_the_dead_letters_cause(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    bolt = Bolt(reject_odd, ackers.addresses, name="reject_odd")
    store_db = DeadLetterStore(tmp_path / "dead.sqlite")
    pipeline = GuaranteedPipeline(
        spark, client, partitions=2, policy=ReplayPolicy(max_attempts=1), dead_letters=store_db
    )
    stats = pipeline.run(RECORDS[:10], lambda rdd: bolt.apply(rdd).count())
    assert (stats.acked, stats.dead_lettered, stats.job_errors) == (5, 5, 0)
    assert {d.key: (d.reason, d.cause) for d in store_db.all()} == {
        key: (Outcome.FAILED, f"odd number {value.rsplit(' ', 1)[1]}") for key, value in RECORDS[1:10:2]
    }
