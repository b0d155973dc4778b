"""Tracked DataFrame jobs on local Spark: row-function Bolt.apply_df over SourcePipeline's frame, groupBy and repartition."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient, MessageId, TrackedTuple
from acker_client.testing import local_cluster
from acker_demo.wordcount import tokenize
from acker_spark import Bolt, Delivery, close_clients, generated_sentences
from acker_spark.sqlite import open_db, upsert
from acker_spark.steps.frames import delivery_frame, unpack_ids
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from .test_rdd_bolts import assert_every_record_acked_once, run_source, task_attempts

# Spark's workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

WORDS = "key string, position int, word string"

# No test here is about lost trees, and a group-by job on a busy 2-core machine can
# outlast the suite's short acker timeout, making every tree time out and replay: these
# tests get ackers whose timeout outlives any job they run.
PATIENT_TIMEOUT = 60.0


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers with a timeout no micro-batch job here reaches."""
    with local_cluster(3, message_timeout=PATIENT_TIMEOUT) as cluster:
        yield cluster
    close_clients()


SINK_COLUMNS = ("record_key", "position", "word")


def split_rows(tuples: Iterator[Any], collector: Any) -> Iterator[Any]:
    """Bolt function over delivery Rows: one (key, position, word) child per word, anchored to its sentence."""
    for sentence in tuples:
        for position, word in enumerate(tokenize(sentence.value.value)):
            yield collector.emit((sentence.value.key, position, word), anchors=[sentence])
        collector.ack(sentence)


class StoreGroups:
    """Sink bolt over groupBy rows (word, members): write each member's row, then ack the group."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def __call__(self, tuples: Iterator[Any], collector: Any) -> Iterator[Any]:
        groups = list(tuples)
        rows = [(m.key, m.position, g.value.word) for g in groups for m in g.value.members]
        with open_db(self.db) as conn:
            upsert(conn, "words", SINK_COLUMNS, rows)
        for group in groups:
            collector.ack(group)
        return iter(())


class StoreWords:
    """Sink bolt over word Rows; attempt 0 of ``crash_partition`` raises after writing, before acking."""

    def __init__(self, db: Path, crash_partition: int | None = None) -> None:
        self.db = db
        self.crash_partition = crash_partition

    def __call__(self, tuples: Iterator[Any], collector: Any) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        words = list(tuples)
        if not words:  # a task of the pipeline's check on an empty frame: neither logged nor crashed
            return iter(())
        with open_db(self.db) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS task_runs (stage TEXT, partition INT, attempt INT)")
            conn.execute(
                "INSERT INTO task_runs VALUES ('store', ?, ?)", (context.partitionId(), context.attemptNumber())
            )
            upsert(conn, "words", SINK_COLUMNS, [tuple(w.value) for w in words])
        if (context.partitionId(), context.attemptNumber()) == (self.crash_partition, 0):
            raise RuntimeError("injected: first attempt dies after writing")
        for word in words:
            collector.ack(word)
        return iter(())


def test_dataframe_groupby_word_count_acks_every_record_once(
    spark: Any, ackers: Any, client: ClusterClient, db: Path
) -> None:
    """Sentences -> words -> groupBy(word) with collected ids -> sink: every record ACKED once, sink exact."""
    records = list(generated_sentences(200, seed=21))
    split = Bolt(split_rows, ackers.addresses, name="split")
    store = Bolt(StoreGroups(db), ackers.addresses, name="store")
    seen: list[list[str]] = []

    def job(df: Any) -> None:
        seen.append(df.columns)
        words = split.apply_df(df, WORDS)
        groups = words.groupBy("word").agg(
            F.collect_list(F.struct("key", "position")).alias("members"),
            # One row now stands for many: collecting their ids lets acking it ack them all.
            F.collect_list("_acker_ids").alias("_acker_ids"),
        )
        store.apply_df(groups).count()

    stats = run_source(spark, client, db, records, job)
    # The pipeline's check on an empty frame, then one round: the in-memory source's columns and the tracking ones.
    assert seen == [["key", "value", "_record_key", "_attempt", "_acker_ids"]] * 2
    assert_every_record_acked_once(stats, records, db)


def test_dataframe_repartition_with_a_retried_task(spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """Words repartitioned by key hash; the sink's attempt 0 of one partition dies; the retry acks each record once."""
    records = list(generated_sentences(120, seed=22))
    split = Bolt(split_rows, ackers.addresses, name="split")
    store = Bolt(StoreWords(db, crash_partition=1), ackers.addresses, name="store")

    def job(df: Any) -> None:
        words = split.apply_df(df, WORDS).repartition(4, "word")
        store.apply_df(words).count()

    stats = run_source(spark, client, db, records, job)
    assert task_attempts(db)[1] == stats.jobs == 1  # the round's crashed task was retried by Spark
    assert_every_record_acked_once(stats, records, db)


def test_apply_df_output_columns_and_tracking(spark: Any, ackers: Any) -> None:
    """apply_df's result has the schema's columns plus _acker_ids, one 16-byte pair per root of each child."""
    batch = [TrackedTuple(Delivery(f"k{i}", "a b", 1), MessageId.single(100 + i, 7)) for i in range(3)]
    split = Bolt(split_rows, None, name="untracked-split")  # no acker: look at the ids only
    out = split.apply_df(delivery_frame(spark, batch, 2), WORDS)
    assert out.columns == ["key", "position", "word", "_acker_ids"]
    rows = out.collect()
    assert sorted((r.key, r.position, r.word) for r in rows) == [
        (f"k{i}", p, w) for i in range(3) for p, w in enumerate("ab")
    ]
    assert all(unpack_ids(r["_acker_ids"]) == MessageId.EMPTY for r in rows)  # untracked children
    tracked = Bolt(split_rows, ackers.addresses, name="split")
    children = tracked.apply_df(delivery_frame(spark, batch, 2), WORDS).collect()
    assert sorted(unpack_ids(r["_acker_ids"]).roots for r in children) == sorted([(100 + i,) for i in range(3)] * 2)
    assert all(len(r["_acker_ids"]) == 16 for r in children)


def test_apply_df_needs_the_tracking_column(spark: Any) -> None:
    """A DataFrame without _acker_ids is refused on the driver with a message naming the column."""
    df = spark.createDataFrame([("a",)], "word string")
    with pytest.raises(ValueError, match="_acker_ids"):
        Bolt(split_rows, None).apply_df(df, WORDS)


def test_delivery_frame_value_type(spark: Any) -> None:
    """value_type sets the value column's type; key, attempt and the packed ids come along."""
    batch = [TrackedTuple(Delivery("k", 41, 2), MessageId.single(5, 6))]
    df = delivery_frame(spark, batch, 4, LongType())
    assert df.schema["value"].dataType == LongType()
    (row,) = df.collect()
    assert (row.key, row.value, row.attempt, unpack_ids(row["_acker_ids"])) == ("k", 41, 2, MessageId.single(5, 6))
