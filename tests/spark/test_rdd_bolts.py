"""RDD bolts over SourcePipeline's records: shuffles, task retries, recomputed stages, replays and dead letters.

The job turns the pipeline's frame into an RDD of tracked tuples
(``tracked_rdd``) and runs row-function ``Bolt``s over it with
``keyBy``/``partitionBy`` shuffles, as RDD jobs are written.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_demo.wordcount import (
    CountWords,
    FailureInjection,
    expected_counts,
    sink_counts,
    split_words,
    stable_partition,
    word_of,
)
from acker_protocol.wire import Outcome
from acker_spark import (
    Bolt,
    DeadLetterStore,
    ReplayPolicy,
    SourcePipeline,
    close_clients,
    generated_sentences,
    tracked_rdd,
)
from acker_spark.sqlite import open_db
from pyspark import cloudpickle

from .test_source_pipeline import PATIENT_TIMEOUT

# Spark's workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

FAST = ReplayPolicy(max_attempts=4, backoff_base=0.05, backoff_factor=2.0, backoff_cap=0.5)


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers whose timeout no job here reaches (no test here is about lost trees)."""
    with local_cluster(3, message_timeout=PATIENT_TIMEOUT) as cluster:
        yield cluster
    close_clients()


def deliveries(df: Any) -> Any:
    """The pipeline's frame as an RDD of tracked tuples whose value has ``key``, ``value`` and ``attempt``."""
    return tracked_rdd(df.selectExpr("_record_key AS key", "value", "_attempt AS attempt", "_acker_ids"))


def run_source(
    spark: Any, client: ClusterClient, db: Path, records: list[Any], job: Callable[[Any], object], **options: Any
) -> Any:
    """Run ``job`` over ``records`` (in memory) through a SourcePipeline with dead letters in ``db``; its stats."""
    options.setdefault("policy", FAST)
    checkpoint = db.with_name(db.stem + "-checkpoint")
    pipeline = SourcePipeline(spark, client, checkpoint, dead_letters=DeadLetterStore(db), progress=None, **options)
    return pipeline.run(records, job)


def task_runs(db: Path) -> list[tuple[str, int, int]]:
    """(stage, partition, attempt) of each task run that held tuples, from the table the tests' bolts fill."""
    with open_db(db) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS task_runs (stage TEXT, partition INT, attempt INT)")
        return list(conn.execute("SELECT stage, partition, attempt FROM task_runs"))


def task_attempts(db: Path) -> Counter[int]:
    """How many task runs each attempt number had."""
    return Counter(attempt for _, _, attempt in task_runs(db))


def audited(fn: Callable[..., Any], db: Path, stage: str, crash_partition: int | None = None) -> Callable[..., Any]:
    """Wrap a bolt function: log each task run that gets tuples, and crash attempt 0 of one partition mid-way.

    Only runs that get a tuple are logged: the pipeline also runs the job once
    on an empty frame (its check before reading), whose tasks get none.
    """

    def wrapper(tuples: Any, collector: Any) -> Any:
        from pyspark import TaskContext

        context = TaskContext.get()
        tuples = iter(tuples)
        first = next(tuples, None)
        if first is None:
            return
        with open_db(db) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS task_runs (stage TEXT, partition INT, attempt INT)")
            conn.execute(
                "INSERT INTO task_runs VALUES (?, ?, ?)", (stage, context.partitionId(), context.attemptNumber())
            )
        crash = context.partitionId() == crash_partition and context.attemptNumber() == 0

        def all_tuples() -> Iterator[Any]:
            yield first
            yield from tuples

        for n, out in enumerate(fn(all_tuples(), collector)):
            if crash and n == 1:
                raise RuntimeError("injected: first attempt dies mid-partition")
            yield out
        if crash:
            raise RuntimeError("injected: first attempt dies at the end of its partition")

    return wrapper


def assert_every_record_acked_once(stats: Any, records: list[Any], db: Path) -> None:
    """Each record acked on its first delivery, nothing failed, replayed or dead-lettered; the sink exact."""
    assert (stats.emitted, stats.acked, stats.replayed, stats.dead_lettered, stats.pending) == (
        len(records),
        len(records),
        0,
        0,
        0,
    )
    assert (stats.failed, stats.timed_out, stats.lost, stats.job_errors) == (0, 0, 0, 0)
    assert sink_counts(db) == expected_counts(records)


def test_rdd_bolts_through_task_retries_replay_exactly_the_failed_records(
    spark: Any, ackers: Any, client: ClusterClient, db: Path
) -> None:
    """Attempt 0 of a task per stage dies (Spark retries it, no delivery lost); failed records replay or dead-letter."""
    records = list(generated_sentences(160, seed=4))
    keys = [key for key, _ in records]
    always, once = frozenset(keys[5:8]), frozenset(keys[40:50])
    injection = FailureInjection(always_fail=always, fail_first=once)
    split = Bolt(audited(split_words, db, "split", crash_partition=0), ackers.addresses, name="split")
    count = Bolt(audited(CountWords(db, injection), db, "count", crash_partition=2), ackers.addresses, name="count")

    def job(df: Any) -> None:
        words = split.apply(deliveries(df)).keyBy(word_of).partitionBy(4, stable_partition).values()
        count.apply(words).count()

    stats = run_source(spark, client, db, records, job, policy=ReplayPolicy(max_attempts=3, backoff_base=0.05))
    assert task_attempts(db)[1] >= 2  # the injected crashes were retried by Spark
    dead = DeadLetterStore(db).all()
    assert {d.key: (d.reason, d.attempts) for d in dead} == {k: (Outcome.FAILED, 3) for k in always}
    assert (stats.emitted, stats.acked, stats.dead_lettered, stats.pending) == (len(records), len(records) - 3, 3, 0)
    # Only the injected failures were replayed: a crashed task retried by Spark costs no delivery.
    assert (stats.replayed, stats.failed) == (len(once) + 2 * len(always), len(once) + 3 * len(always))
    assert (stats.timed_out, stats.lost) == (0, 0)
    assert sink_counts(db) == expected_counts(records, always)


def test_recomputed_stage_is_deduplicated(spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """An un-cached stage run by two actions re-sends its acks; the acker drops the repeat, no tree hangs."""
    records = list(generated_sentences(200, seed=3))
    split = Bolt(audited(split_words, db, "split"), ackers.addresses, name="split")
    count = Bolt(CountWords(db), ackers.addresses, name="count")

    def job(df: Any) -> None:
        words = split.apply(deliveries(df))
        words.count()  # first computation of the split stage: its acks are committed here
        by_word = words.keyBy(word_of).partitionBy(4, stable_partition).values()  # ... and recomputed here
        count.apply(by_word).count()

    stats = run_source(spark, client, db, records, job)
    runs = Counter(partition for stage, partition, _ in task_runs(db) if stage == "split")
    assert runs and set(runs.values()) == {2}  # every split partition computed twice
    assert sum(s.ledger.stats.deduplicated for s in ackers.servers) == len(records)
    assert_every_record_acked_once(stats, records, db)


def test_tracked_rdd_reads_each_rows_value_and_ids(spark: Any) -> None:
    """Each row becomes a TrackedTuple: its value a Row of the other columns, its MessageId the packed ids."""
    from acker_client import MessageId
    from acker_spark import pack_ids

    ids = MessageId.single(5, 6)
    frame = spark.createDataFrame(
        [("k", "v", 2, pack_ids(ids))], "key string, value string, attempt int, _acker_ids binary"
    )
    (tracked,) = tracked_rdd(frame).collect()
    assert (tracked.value.key, tracked.value.value, tracked.value.attempt, tracked.message_id) == ("k", "v", 2, ids)
    assert "_acker_ids" not in tracked.value.asDict()


def test_tracked_rdd_needs_the_tracking_column(spark: Any) -> None:
    """A frame without _acker_ids is refused on the driver with a message naming the column."""
    with pytest.raises(ValueError, match="_acker_ids"):
        tracked_rdd(spark.createDataFrame([("a",)], "word string"))
