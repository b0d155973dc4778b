"""ArrowBolt jobs through SourcePipeline on local Spark: word count, shuffles, groupBy aggregation, task retries, replays, pandas."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from acker_client import ClusterClient, MessageId, TrackedTuple
from acker_client.testing import local_cluster
from acker_demo import dataframe_job
from acker_demo.wordcount import FailureInjection, expected_counts, sink_counts
from acker_spark import ArrowBolt, Delivery, close_clients, generated_sentences
from acker_spark.sqlite import open_db, upsert
from acker_spark.steps.frames import delivery_frame, pack_ids, unpack_ids
from pyspark import cloudpickle
from pyspark.sql import functions as F

from .test_rdd_bolts import assert_every_record_acked_once, run_source, task_attempts

# Spark's workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

SINK_COLUMNS = ("record_key", "position", "word")


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers whose timeout outlives any job here (no test here is about lost trees)."""
    with local_cluster(3, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


def run_frames(spark: Any, client: ClusterClient, db: Path, records: list[Any], job: Any) -> Any:
    """Run ``job`` through a SourcePipeline over ``records``, on frames of ``key``, ``value``, ``attempt``; its stats."""

    def framed(df: Any) -> None:
        job(df.selectExpr("_record_key AS key", "value", "_attempt AS attempt", "_acker_ids"))

    return run_source(spark, client, db, records, framed)


def log_task(db: Path, stage: str) -> tuple[int, int]:
    """Record this task run in the ``task_runs`` table; return (partition, attempt)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    with open_db(db) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS task_runs (stage TEXT, partition INT, attempt INT)")
        conn.execute("INSERT INTO task_runs VALUES (?, ?, ?)", (stage, context.partitionId(), context.attemptNumber()))
    return context.partitionId(), context.attemptNumber()


def test_arrow_word_count_acks_every_record_once(spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """The demo's ArrowBolt job (split, repartition by word, sink): every record ACKED once, sink exact."""
    records = list(generated_sentences(200, seed=31))
    job, (split, count) = dataframe_job.build_job(ackers.addresses, db, partitions=3)
    stats = run_frames(spark, client, db, records, job)
    assert_every_record_acked_once(stats, records, db)
    # One commit per task that ran (Spark may skip empty partitions), counted on the driver.
    assert split.commits.value >= stats.jobs and count.commits.value >= stats.jobs
    assert split.commit_errors.value == count.commit_errors.value == 0


class StoreGroups:
    """ArrowBolt sink over groupBy rows (word, members): write each member's row; return acks the groups."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        words = batch.column("word").to_pylist()
        members = batch.column("members").to_pylist()
        rows = [(m["key"], m["position"], w) for w, ms in zip(words, members) for m in ms]
        with open_db(self.db) as conn:
            upsert(conn, "words", SINK_COLUMNS, rows)


def test_groupby_collect_list_acks_every_collected_row(
    spark: Any, ackers: Any, client: ClusterClient, db: Path
) -> None:
    """groupBy(word) with collect_list("_acker_ids"): acking a group acks all its rows; every record ACKED once."""
    records = list(generated_sentences(150, seed=32))
    split = ArrowBolt(dataframe_job.split_sentences, ackers.addresses, schema=dataframe_job.WORD_SCHEMA)
    store = ArrowBolt(StoreGroups(db), ackers.addresses, schema=None, name="store")

    def job(df: Any) -> None:
        groups = (
            split.apply_df(df)
            .groupBy("word")
            .agg(
                F.collect_list(F.struct("key", "position")).alias("members"),
                F.collect_list("_acker_ids").alias("_acker_ids"),
            )
        )
        store.apply_df(groups).count()

    stats = run_frames(spark, client, db, records, job)
    assert_every_record_acked_once(stats, records, db)


class CrashingSink:
    """ArrowBolt sink: write the rows; attempt 0 of ``crash_partition`` raises after its first batch's write."""

    def __init__(self, db: Path, crash_partition: int) -> None:
        self.db = db
        self.crash_partition = crash_partition

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        partition, attempt = log_task(self.db, "store")
        columns = batch.to_pydict()
        with open_db(self.db) as conn:
            upsert(conn, "words", SINK_COLUMNS, list(zip(columns["key"], columns["position"], columns["word"])))
        if (partition, attempt) == (self.crash_partition, 0):
            raise RuntimeError("injected: the first attempt dies after writing")


def test_task_retry_acks_each_tree_once(spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """A sink task's attempt 0 dies after writing; Spark's retry commits once: no doubled acks, no timeouts."""
    records = list(generated_sentences(120, seed=33))
    split = ArrowBolt(dataframe_job.split_sentences, ackers.addresses, schema=dataframe_job.WORD_SCHEMA)
    store = ArrowBolt(CrashingSink(db, crash_partition=1), ackers.addresses, schema=None, name="store")

    def job(df: Any) -> None:
        store.apply_df(split.apply_df(df).repartition(4, "word")).count()

    stats = run_frames(spark, client, db, records, job)
    assert task_attempts(db)[1] >= stats.jobs == 1  # the round's crashed task was retried by Spark
    assert_every_record_acked_once(stats, records, db)


def test_failed_rows_are_replayed(spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """Words the sink fails on a record's first delivery fail its tree; the replay is acked."""
    records = list(generated_sentences(80, seed=34))
    doomed = frozenset(key for key, _ in records[::10])
    injection = FailureInjection(fail_first=doomed)
    job, _ = dataframe_job.build_job(ackers.addresses, db, partitions=2, injection=injection)
    stats = run_frames(spark, client, db, records, job)
    assert (stats.acked, stats.failed, stats.replayed, stats.dead_lettered) == (80, len(doomed), len(doomed), 0)
    assert sink_counts(db) == expected_counts(records)


def split_in_pieces(batch: pa.RecordBatch, collector: Any) -> None:
    """Split, emitting each sentence's words in three calls (by position mod 3), last ones first."""
    out: list[tuple[dict[str, Any], np.ndarray]] = []

    class Capture:
        def emit(self, columns: dict[str, Any], anchors: np.ndarray) -> None:
            out.append((columns, anchors))

    dataframe_job.split_sentences(batch, Capture())
    ((columns, anchors),) = out
    table = pa.table(columns)
    positions = table.column("position").to_numpy()
    for residue in (2, 1, 0):
        rows = np.flatnonzero(positions % 3 == residue)
        collector.emit(table.take(pa.array(rows, pa.int64())), anchors=anchors[rows])


def test_several_emits_per_batch(spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """Children of one parent emitted over several emit calls get distinct ordinals: every tree completes."""
    records = list(generated_sentences(100, seed=35))
    split = ArrowBolt(split_in_pieces, ackers.addresses, schema=dataframe_job.WORD_SCHEMA, name="split")
    count = ArrowBolt(dataframe_job.CountWordRows(db), ackers.addresses, schema=None, name="count")

    def job(df: Any) -> None:
        count.apply_df(split.apply_df(df).repartition(3, "word")).count()

    stats = run_frames(spark, client, db, records, job)
    assert_every_record_acked_once(stats, records, db)


def split_pandas(frame: Any, collector: Any) -> None:
    """pandas-mode split: one row per word, anchored to its sentence's position in the frame."""
    words = frame["value"].str.lower().str.findall(r"[\w']+")
    exploded = words.explode().dropna()
    anchors = exploded.index.to_numpy()
    positions = exploded.groupby(level=0).cumcount().to_numpy()
    out = {
        "key": frame["key"].to_numpy()[anchors],
        "position": positions.astype("int32"),
        "word": exploded.to_numpy(),
        "attempt": frame["attempt"].to_numpy()[anchors],
    }
    import pandas as pd

    collector.emit(pd.DataFrame(out), anchors=anchors)


def store_pandas(db: Path) -> Any:
    """pandas-mode sink: write the frame's rows."""

    def store(frame: Any, collector: Any) -> None:
        with open_db(db) as conn:
            upsert(conn, "words", SINK_COLUMNS, list(frame[["key", "position", "word"]].itertuples(index=False)))

    return store


def test_pandas_mode(spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """pandas=True hands the functions DataFrames and takes DataFrames back: every record ACKED once, sink exact."""
    records = list(generated_sentences(100, seed=36))
    split = ArrowBolt(split_pandas, ackers.addresses, schema=dataframe_job.WORD_SCHEMA, pandas=True)
    store = ArrowBolt(store_pandas(db), ackers.addresses, schema=None, pandas=True, name="store")

    def job(df: Any) -> None:
        store.apply_df(split.apply_df(df).repartition(2, "word")).count()

    stats = run_frames(spark, client, db, records, job)
    assert_every_record_acked_once(stats, records, db)


def copy_rows(batch: pa.RecordBatch, collector: Any) -> None:
    """One child per input row, anchored to it; and one unanchored row."""
    collector.emit({"key": batch.column("key")}, anchors=np.arange(batch.num_rows))
    collector.emit({"key": pa.array(["free"] * min(1, batch.num_rows))}, anchors=-1)


def test_output_ids_for_single_and_multi_root_parents(spark: Any, ackers: Any) -> None:
    """Children carry every root of their parent with one edge id; unanchored and untracked children carry none."""
    batch = [
        TrackedTuple(Delivery("one", "x", 1), MessageId.single(11, 5)),
        TrackedTuple(Delivery("two", "y", 1), MessageId({21: 6, 22: 7})),
    ]
    frame = delivery_frame(spark, batch, 1)
    tracked = ArrowBolt(copy_rows, ackers.addresses, schema="key string").apply_df(frame).collect()
    by_key = {r.key: unpack_ids(r["_acker_ids"]) for r in tracked}
    assert set(by_key["one"].roots) == {11} and set(by_key["two"].roots) == {21, 22}
    assert by_key["two"][21] == by_key["two"][22] not in (6, 7)
    assert by_key["free"] == MessageId.EMPTY
    untracked = ArrowBolt(copy_rows, None, schema="key string").apply_df(frame).collect()
    assert sorted(r.key for r in untracked) == ["free", "one", "two"]
    assert all(r["_acker_ids"] == b"" for r in untracked)


def test_untracked_arrow_job_matches_the_input(spark: Any, db: Path) -> None:
    """addresses=None: the same ArrowBolt job with no acker writes exactly the input's words."""
    from acker_demo.untracked import run_untracked

    records = list(generated_sentences(40, seed=37))
    job, _ = dataframe_job.build_job(None, db, partitions=2)
    stats = run_untracked(spark, records, job, batch_size=25, as_dataframe=True)
    assert (stats.acked, stats.jobs) == (40, 2)
    assert sink_counts(db) == expected_counts(records)


def test_apply_df_refuses_a_frame_without_tracking(spark: Any) -> None:
    """A DataFrame without _acker_ids is refused on the driver, naming the column."""
    df = spark.createDataFrame([("a",)], "word string")
    with pytest.raises(ValueError, match="_acker_ids"):
        ArrowBolt(copy_rows, None, schema="key string").apply_df(df)


def test_aggregated_ids_decode_on_the_executors(spark: Any, ackers: Any) -> None:
    """A hand-built aggregated column decodes on the executors as unpack_ids does (a quick end-to-end codec check)."""
    packed = [pack_ids(MessageId.single(3, 9)), pack_ids(MessageId({3: 1, 4: 2}))]
    df = spark.createDataFrame([("g", packed)], "key string, _acker_ids array<binary>")
    out = ArrowBolt(copy_rows, ackers.addresses, schema="key string", uid=7).apply_df(df)
    rows = [r for r in out.collect() if r.key == "g"]
    assert [set(unpack_ids(r["_acker_ids"]).roots) for r in rows] == [{3, 4}]
