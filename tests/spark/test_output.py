"""Exactly-once output: SourcePipeline commits the rows of the deliveries that ACKED with Spark's own writers."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_spark import ArrowBolt, ReplayPolicy, close_clients
from acker_spark.executor_read.source_pipeline import JobWritesItself, OutputNotReturned, SourcePipeline
from acker_spark.output import BatchOutput, FileOutput, TableOutput, published_files
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

FAST = ReplayPolicy(max_attempts=4, backoff_base=0.05, backoff_cap=0.2)


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers with a timeout no job here reaches."""
    with local_cluster(3, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


def keyed_source(spark: Any, count: int, partitions: int = 4) -> Any:
    """``count`` records ``(id, text)``: record i has i % 5 + 1 words."""
    rows = [(f"k{i:05d}", " ".join(f"w{i}_{j}" for j in range(i % 5 + 1))) for i in range(count)]
    return spark.createDataFrame(rows, "id string, text string").repartition(partitions)


def expected_words(count: int) -> Counter[tuple[str, str]]:
    """Each output row ``(id, word)`` the split job makes, once."""
    return Counter((f"k{i:05d}", f"w{i}_{j}") for i in range(count) for j in range(i % 5 + 1))


class FlakySplit:
    """Splits ``text`` into words; fails every record whose id ends in ``fail_digit`` on its first delivery."""

    def __init__(self, fail_digit: str | None = None) -> None:
        self.fail_digit = fail_digit

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        pieces = pc.split_pattern(batch.column("text"), " ")
        parents = pc.list_parent_indices(pieces)
        ids = pc.take(batch.column("id"), parents)
        collector.emit(
            {"id": ids, "word": pc.list_flatten(pieces), "bucket": pc.utf8_slice_codeunits(ids, 5, 6)}, anchors=parents
        )
        if self.fail_digit is not None:
            first = batch.column("_attempt").to_numpy() == 1
            last = np.array([s.endswith(self.fail_digit) for s in batch.column("id").to_pylist()])
            collector.fail(np.flatnonzero(first & last))


def split_job(addresses: Any, fail_digit: str | None = None) -> Any:
    """The job: split text into (id, word, bucket) rows anchored to their record; returns the output frame."""
    bolt = ArrowBolt(FlakySplit(fail_digit), addresses, schema="id string, word string, bucket string", name="split")
    return lambda df: bolt.apply_df(df)


def rows_of(frame: Any) -> Counter[tuple[str, str]]:
    """The ``(id, word)`` rows of a DataFrame, counted."""
    return Counter((r["id"], r["word"]) for r in frame.select("id", "word").collect())


def test_partitioned_parquet_holds_each_acked_row_once(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """Records failed on their first delivery are replayed; the Parquet output has every row of every record once."""
    out = tmp_path / "out"
    pipeline = SourcePipeline(
        spark, client, tmp_path / "cp", policy=FAST, output=FileOutput(str(out), partition_by=["bucket"])
    )
    stats = pipeline.run(keyed_source(spark, 200), split_job(ackers.addresses, fail_digit="7"), key="id")
    assert (stats.acked, stats.replayed, stats.dead_lettered) == (200, 20, 0)
    assert stats.output_rows == sum(expected_words(200).values())
    assert rows_of(spark.read.parquet(str(out))) == expected_words(200)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("bucket=")) == [f"bucket={d}" for d in range(10)]
    assert {p.relative_to(out) for p in published_files(out)} == {
        p.relative_to(out) for p in out.rglob("*.parquet") if ".acker-staging" not in str(p)
    }


def test_commit_every_round_and_formats(spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path) -> None:
    """Commits per round: the first round's rows are committed before the replays' rows, in JSON files."""
    out = tmp_path / "out"
    pipeline = SourcePipeline(
        spark,
        client,
        tmp_path / "cp",
        policy=FAST,
        output=FileOutput(str(out), format="json"),
        commit_every="round",
    )
    stats = pipeline.run(keyed_source(spark, 100), split_job(ackers.addresses, fail_digit="3"), key="id")
    assert stats.output_commits >= 2
    assert rows_of(spark.read.json(str(out))) == expected_words(100)
    markers = sorted((out / "_acker_commits").glob("*.json"))
    assert len(markers) == stats.output_commits
    assert all(json.loads(m.read_text())["files"] for m in markers)


def test_table_and_function_outputs(spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path) -> None:
    """saveAsTable creates the table on the first commit; a function gets each commit once with its id."""
    table = f"words_{tmp_path.name.replace('-', '_')}"
    pipeline = SourcePipeline(
        spark, client, tmp_path / "cp1", policy=FAST, output=TableOutput(table, partition_by=["bucket"])
    )
    pipeline.run(keyed_source(spark, 60), split_job(ackers.addresses, fail_digit="1"), key="id")
    assert rows_of(spark.table(table)) == expected_words(60)
    spark.sql(f"DROP TABLE {table}")

    calls: list[tuple[str, Counter[tuple[str, str]]]] = []
    function = BatchOutput(lambda commit_id, df: calls.append((commit_id, rows_of(df))))
    pipeline = SourcePipeline(spark, client, tmp_path / "cp2", policy=FAST, output=function, commit_every="round")
    pipeline.run(keyed_source(spark, 60), split_job(ackers.addresses, fail_digit="2"), key="id")
    assert len({commit_id for commit_id, _ in calls}) == len(calls) >= 2
    assert sum((rows for _, rows in calls), Counter()) == expected_words(60)


def test_overwrite_replaces_earlier_data_and_error_refuses(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """mode='overwrite' drops what the folder held before the run; mode='error' refuses a folder with data."""
    out = tmp_path / "out"
    spark.createDataFrame([("old", "row", "0")], "id string, word string, bucket string").write.parquet(str(out))
    refused = SourcePipeline(spark, client, tmp_path / "cp0", output=FileOutput(str(out), mode="error"))
    with pytest.raises(FileExistsError, match="already holds data"):
        refused.run(keyed_source(spark, 10), split_job(ackers.addresses), key="id")
    pipeline = SourcePipeline(
        spark, client, tmp_path / "cp", policy=FAST, output=FileOutput(str(out), mode="overwrite")
    )
    pipeline.run(keyed_source(spark, 30), split_job(ackers.addresses), key="id")
    assert rows_of(spark.read.parquet(str(out))) == expected_words(30)


def test_job_that_does_not_return_its_output_is_refused(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """With an output, a job that runs its own action is told to return the DataFrame."""
    bolt = ArrowBolt(FlakySplit(), ackers.addresses, schema="id string, word string, bucket string", name="split")
    pipeline = SourcePipeline(spark, client, tmp_path / "cp", output=FileOutput(str(tmp_path / "out")))
    with pytest.raises(OutputNotReturned, match="must return its output DataFrame"):
        pipeline.run(keyed_source(spark, 10), lambda df: bolt.apply_df(df).count(), key="id")


def test_writer_after_a_bolt_is_named_at_once_not_replayed(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """The natural mistake, bolt.apply_df(df).write.parquet(...): the run stops naming it before reading a record."""
    bolt = ArrowBolt(FlakySplit(), ackers.addresses, schema="id string, word string, bucket string", name="split")
    out = tmp_path / "out"
    pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, stall_after=3.0)
    with pytest.raises(JobWritesItself, match="writes its output itself"):
        pipeline.run(
            keyed_source(spark, 50), lambda df: bolt.apply_df(df).write.mode("append").parquet(str(out)), key="id"
        )
    assert not out.exists()  # refused before it wrote
    assert pipeline.stats.emitted == 0


class Crash(BaseException):
    """Stands for the driver dying at that point (a BaseException: nothing in the pipeline handles it)."""


def test_a_commit_interrupted_while_publishing_is_finished_once(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver dies after moving two of a commit's files: the next driver moves the rest, nothing twice."""
    import acker_spark.output.folder_publish as destinations

    out = tmp_path / "out"
    output = FileOutput(str(out), partition_by=["bucket"])
    real_replace, moves = os.replace, []

    def dying_replace(src: Any, dst: Any) -> None:
        if "-c00000" in str(src):  # the commit's files moving into place (after its rows were chosen)
            if len(moves) == 2:
                raise Crash("killed while publishing")
            moves.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(destinations.os, "replace", dying_replace)
    with pytest.raises(Crash):
        SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=output).run(
            keyed_source(spark, 80), split_job(ackers.addresses), key="id"
        )
    monkeypatch.setattr(destinations.os, "replace", real_replace)
    assert 0 < len(rows_of(spark.read.parquet(str(out)))) < len(expected_words(80))  # half a commit visible
    stats = SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=output).run(
        keyed_source(spark, 80), split_job(ackers.addresses), key="id"
    )
    assert stats.resumed and stats.rounds == 0  # nothing read again: only the commit was finished
    assert rows_of(spark.read.parquet(str(out))) == expected_words(80)
    assert len(list((out / "_acker_commits").glob("*.json"))) == 1


def test_a_function_commit_interrupted_is_called_again_with_the_same_id_and_rows(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """BatchOutput: a call that dies is made again, same commit id, same rows; then never again."""
    calls: list[tuple[str, Counter[tuple[str, str]]]] = []

    def flaky(commit_id: str, df: Any) -> None:
        calls.append((commit_id, rows_of(df)))
        if len(calls) == 1:
            raise Crash("killed inside the function")

    output = BatchOutput(flaky)
    with pytest.raises(Crash):
        SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=output).run(
            keyed_source(spark, 40), split_job(ackers.addresses), key="id"
        )
    SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=output).run(
        keyed_source(spark, 40), split_job(ackers.addresses), key="id"
    )
    SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=output).run(
        keyed_source(spark, 40), split_job(ackers.addresses), key="id"
    )
    assert len(calls) == 2 and calls[0] == calls[1]
    assert calls[0][1] == expected_words(40)


def test_rows_of_failed_and_superseded_deliveries_are_never_committed(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """Each record's rows come from the delivery that ACKED: the failed first delivery's staged rows stay out."""
    out = tmp_path / "out"

    class Tagged(FlakySplit):
        def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
            pieces = pc.split_pattern(batch.column("text"), " ")
            parents = pc.list_parent_indices(pieces)
            columns = {
                "id": pc.take(batch.column("id"), parents),
                "word": pc.list_flatten(pieces),
                "attempt": pc.take(batch.column("_attempt"), parents),
            }
            collector.emit(columns, anchors=parents)
            first = batch.column("_attempt").to_numpy() == 1
            collector.fail(np.flatnonzero(first & (np.arange(batch.num_rows) % 2 == 0)))

    bolt = ArrowBolt(Tagged(), ackers.addresses, schema="id string, word string, attempt int", name="tagged")
    pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=FileOutput(str(out)))
    stats = pipeline.run(keyed_source(spark, 100), bolt.apply_df, key="id")
    assert stats.staged_rows > stats.output_rows  # the failed first deliveries' rows were staged too
    assert not (out / ".acker-staging").exists() or not any((out / ".acker-staging").iterdir())  # dropped at the end
    committed = spark.read.parquet(str(out))
    assert rows_of(committed) == expected_words(100)
    attempts = {r["id"]: set() for r in committed.select("id").collect()}
    for r in committed.select("id", "attempt").collect():
        attempts[r["id"]].add(r["attempt"])
    assert all(len(a) == 1 for a in attempts.values())  # one delivery per record
    assert sum(1 for a in attempts.values() if a == {2}) == stats.replayed > 0


def _fail_in_executor(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    raise RuntimeError("python worker lost (injected)")
    yield from batches  # a generator, as mapInArrow wants


def test_a_commit_whose_spark_job_fails_is_finished_again(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """The commit's Spark job fails once (a task that keeps failing, as a killed worker on local[n] does): the run
    finishes the decided commit again with the same id and rows instead of stopping."""
    calls: list[tuple[str, Counter[tuple[str, str]]]] = []

    def write(commit_id: str, df: Any) -> None:
        if not calls:
            calls.append((commit_id, Counter()))
            df.mapInArrow(_fail_in_executor, df.schema).count()  # the job fails: the call raises
        calls.append((commit_id, rows_of(df)))

    pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=BatchOutput(write))
    stats = pipeline.run(keyed_source(spark, 40), split_job(ackers.addresses), key="id")
    assert len(calls) == 2 and calls[0][0] == calls[1][0]  # the same commit, called again
    assert calls[1][1] == expected_words(40)
    assert stats.output_rows == sum(expected_words(40).values()) and stats.output_commits == 1


def _table_location(spark: Any, table: str) -> Path:
    rows = {r[0]: r[1] for r in spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect()}
    return Path(str(rows["Location"]).removeprefix("file:"))


def test_a_table_switches_to_each_commit_whole_in_one_catalog_step(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver dies while commit 1's snapshot is built: the table reads commit 0, whole; the next run finishes it."""
    import acker_spark.output.folder_publish as folder_publish

    table = f"snap_{tmp_path.name.replace('-', '_')}"
    output = TableOutput(table, partition_by=["bucket"])

    def dying_link(path: Path) -> None:
        if "-c00001" in str(path):  # a staged file of the second commit being linked into its snapshot
            raise Crash("killed while publishing")

    monkeypatch.setattr(folder_publish, "MOVES", [dying_link])
    source, job = keyed_source(spark, 80), split_job(ackers.addresses, fail_digit="4")
    with pytest.raises(Crash):
        SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=output, commit_every="round").run(
            source, job, key="id"
        )
    monkeypatch.setattr(folder_publish, "MOVES", [])
    before = rows_of(spark.table(table))
    first_commit = _table_location(spark, table)
    assert first_commit.parent.name == ".acker-versions" and first_commit.name.endswith("-c00000")
    # Commit 0 whole: every record not failed on its first delivery (ids not ending in 4), each row once.
    assert before == Counter({row: n for row, n in expected_words(80).items() if not row[0].endswith("4")})

    stats = SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=output, commit_every="round").run(
        source, job, key="id"
    )
    assert stats.resumed
    assert rows_of(spark.table(table)) == expected_words(80)
    location = _table_location(spark, table)
    base = location.parent.parent
    assert location != first_commit and location.parent == first_commit.parent  # a later snapshot
    # The folder the table was created in keeps no visible data: a reader of the table reads its snapshot only.
    assert not [p for p in base.rglob("*.parquet") if ".acker-" not in str(p.relative_to(base))]
    assert len(list((base / ".acker-versions").iterdir())) <= 2  # the current snapshot and the one before
    spark.sql(f"DROP TABLE {table}")
    # A new table of the same name can be created where the dropped one's snapshots were.
    pipeline = SourcePipeline(spark, client, tmp_path / "cp2", policy=FAST, output=output)
    pipeline.run(keyed_source(spark, 20), split_job(ackers.addresses), key="id")
    assert rows_of(spark.table(table)) == expected_words(20)
    spark.sql(f"DROP TABLE {table}")


def test_a_table_whose_catalog_lists_its_partitions_is_published_in_place(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """A partitioned table created elsewhere, its partitions in the catalog: rows land once, partitions recovered."""
    table = f"listed_{tmp_path.name.replace('-', '_')}"
    spark.createDataFrame([], "id string, word string, bucket string").write.partitionBy("bucket").saveAsTable(table)
    listed = {r[0]: r[1] for r in spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect()}
    assert listed.get("Partition Provider") == "Catalog"
    pipeline = SourcePipeline(
        spark, client, tmp_path / "cp", policy=FAST, output=TableOutput(table, partition_by=["bucket"])
    )
    pipeline.run(keyed_source(spark, 40), split_job(ackers.addresses, fail_digit="2"), key="id")
    assert rows_of(spark.table(table)) == expected_words(40)
    assert _table_location(spark, table).parent.name != ".acker-versions"
    spark.sql(f"DROP TABLE {table}")
