"""In-memory sources through SourcePipeline: copied once into the checkpoint, read and replayed by Spark from there."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_demo.dataframe_job import WORD_SCHEMA, build_source_job, split_sentences
from acker_demo.wordcount import FailureInjection, expected_counts, sink_counts
from acker_protocol.wire import Outcome
from acker_spark import (
    ArrowBolt,
    DeadLetterStore,
    Record,
    ReplayPolicy,
    TextDirectorySource,
    close_clients,
    generated_sentences,
    records_from,
)
from acker_spark.executor_read.memory_source import DuplicateIdentity, write_records
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.sqlite import open_db, upsert
from acker_spark.tracking.checkpoint import Checkpoint
from pyspark import cloudpickle

from .test_source_pipeline import PATIENT_TIMEOUT, PERSISTENT, sink_keys

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

FAST = ReplayPolicy(max_attempts=4, backoff_base=0.05, backoff_cap=0.2)


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers whose timeout no job here reaches."""
    with local_cluster(3, message_timeout=PATIENT_TIMEOUT) as cluster:
        yield cluster
    close_clients()


def copy_state(checkpoint: Path) -> dict[str, tuple[int, int]]:
    """The in-memory source's copy: each file's size and modification time."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted((checkpoint / "source").iterdir())}


def test_records_from_every_record_acked_sink_exact(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """records_from(values) through SourcePipeline: copied once, each record named by its key, sink exact."""
    lines = [record.value for record in generated_sentences(250)]
    job, _ = build_source_job(ackers.addresses, db)
    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=FAST)
    stats = pipeline.run(records_from(lines), job)
    assert (stats.copied, stats.emitted, stats.acked, stats.replayed, stats.pending) == (250, 250, 250, 0, 0)
    records = list(records_from(lines))
    assert sink_counts(db) == expected_counts(records)
    assert sink_keys(db) == {r.key for r in records}  # _record_key is the record's own key
    copy = pq.read_table(tmp_path / "checkpoint" / "source")
    assert copy.num_rows == 250 and copy.column_names == ["key", "value"]
    assert len(list((tmp_path / "checkpoint" / "source").glob("*.parquet"))) > 1  # read by parallel tasks


def test_generated_sentences_replayed_by_rereading_the_copy(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """A generator (readable once) with failed words and a crashed task: replays re-read the copy by key."""
    copies: list[dict[str, tuple[int, int]]] = []
    checkpoint = tmp_path / "checkpoint"
    injection = FailureInjection(fail_percent=1.0, crash_partition=1, crash_after=20)
    job, _ = build_source_job(ackers.addresses, db, injection=injection)

    def watched(df: Any) -> None:
        copies.append(copy_state(checkpoint))
        job(df)

    pipeline = SourcePipeline(spark, client, checkpoint, policy=PERSISTENT)
    stats = pipeline.run(generated_sentences(300), watched)
    assert stats.failed > 0 and stats.replayed >= stats.failed and stats.rounds > 1
    assert (stats.emitted, stats.acked, stats.dead_lettered, stats.pending) == (300, 300, 0, 0)
    assert sink_counts(db) == expected_counts(list(generated_sentences(300)))
    assert all(state == copies[0] for state in copies)  # every round read the one copy, never rewritten
    # The replay rounds selected failed records by identity (the hash of their key).
    filters = sorted((checkpoint / "rounds").glob("r*.npz"))
    with np.load(filters[1]) as replay:
        assert str(replay["mode"]) == "select" and 0 < len(replay["idents"]) < 300


def test_tuples_dead_letter_keeps_key_and_payload(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """A list of (key, value) tuples; the record that always fails is dead-lettered by key with its value."""
    records = [(f"k{i:03d}", record.value) for i, record in enumerate(generated_sentences(40))]
    job, _ = build_source_job(ackers.addresses, db, injection=FailureInjection(always_fail=frozenset({"k005"})))
    letters = DeadLetterStore(db)
    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=FAST, dead_letters=letters)
    stats = pipeline.run(records, job)
    assert (stats.acked, stats.dead_lettered) == (39, 1)
    [letter] = letters.all()
    assert (letter.key, letter.reason, letter.attempts) == ("k005", Outcome.FAILED, FAST.max_attempts)
    assert letter.record["value"] == dict(records)["k005"]


def test_text_directory_source_is_read_by_spark(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """A TextDirectorySource becomes spark.read.text over its files (blank lines left out, as it would): no copy."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("alpha beta\n\n   \ngamma\n")
    (folder / "b.txt").write_text("delta epsilon alpha\n")
    (folder / ".hidden").write_text("never read\n")
    job, _ = build_source_job(ackers.addresses, db)
    source = TextDirectorySource(folder)
    stats = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=FAST).run(source, job)
    assert (stats.emitted, stats.acked, stats.copied) == (3, 3, 0)
    assert sink_counts(db) == expected_counts(list(source))
    assert not (tmp_path / "checkpoint" / "source").exists()


class DriverKilled(BaseException):
    """Raised out of a job: the driver stops there, as if killed (the pipeline handles Exception only)."""


@dataclass
class RecordingSink:
    """ArrowBolt sink: writes the words and one ``writes`` row per (record, driver run)."""

    db: str
    run: int

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        columns = batch.to_pydict()
        with open_db(self.db) as conn:
            rows = zip(columns["key"], columns["position"], columns["word"])
            upsert(conn, "words", ("record_key", "position", "word"), list(rows))
            conn.executemany("INSERT INTO writes VALUES (?, ?)", sorted({(k, self.run) for k in columns["key"]}))


def recording_job(addresses: list[str], db: Path, run: int) -> Any:
    """split, then the recording sink; the sink sees ``key`` = the record's key."""
    split = ArrowBolt(split_sentences, addresses, schema=WORD_SCHEMA, name="split")
    sink = ArrowBolt(RecordingSink(str(db), run), addresses, schema=None, name="sink")

    def job(df: Any) -> None:
        rows = df.selectExpr("_record_key AS key", "value", "_attempt AS attempt", "_acker_ids")
        sink.apply_df(split.apply_df(rows).repartition(3, "word")).count()

    return job


class MustNotBeRead:
    """An in-memory source the restarted driver must not read again (the checkpoint holds its copy)."""

    def __iter__(self) -> Iterator[Record]:
        raise AssertionError("the restarted driver read the in-memory source again")


def test_restarted_driver_uses_the_copy_and_redoes_no_acked_record(
    spark: Any, ackers: Any, db: Path, tmp_path: Path
) -> None:
    """The first driver dies after acking some records; the second reads the checkpoint's copy, not the source."""
    records = list(generated_sentences(200))
    checkpoint = tmp_path / "checkpoint"
    with open_db(db) as conn:
        conn.execute("CREATE TABLE writes (record_key TEXT, run INTEGER)")
    first_job = recording_job(ackers.addresses, db, 1)

    def dies_after_some(df: Any) -> None:
        first_job(df.where("_record_key < 's00000080'"))  # every tree started, 80 of them acked
        raise DriverKilled

    with ClusterClient(ackers.addresses) as client, pytest.raises(DriverKilled):
        SourcePipeline(spark, client, checkpoint, policy=FAST).run(iter(records), dies_after_some)
    copied = copy_state(checkpoint)
    with ClusterClient(ackers.addresses) as client:
        again = SourcePipeline(spark, client, checkpoint, policy=FAST)
        stats = again.run(MustNotBeRead(), recording_job(ackers.addresses, db, 2))
    assert stats.resumed and stats.copied == 0 and copy_state(checkpoint) == copied
    assert (stats.emitted, stats.acked, stats.pending, stats.dead_lettered) == (200, 200, 0, 0)
    assert sink_counts(db) == expected_counts(records)
    with open_db(db) as conn:
        writes = conn.execute("SELECT record_key, run FROM writes").fetchall()
    first = {key for key, run in writes if run == 1}
    second = {key for key, run in writes if run == 2}
    assert first == {r.key for r in records[:80]}
    assert not first & second, "a record acked under the first driver was processed again"
    assert first | second == {r.key for r in records}
    _, outcomes = Checkpoint(checkpoint).read_outcomes()
    assert (outcomes == int(Outcome.ACKED)).sum() >= 200


def test_resuming_with_another_kind_of_source_is_refused(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """A checkpoint holding an in-memory copy refuses a DataFrame, and one of a DataFrame refuses an in-memory source."""
    job, _ = build_source_job(ackers.addresses, db)
    SourcePipeline(spark, client, tmp_path / "mem", policy=FAST).run(records_from(["a b"]), job)
    with pytest.raises(ValueError, match="holds a copy of an in-memory source"):
        SourcePipeline(spark, client, tmp_path / "mem").run(spark.read.parquet(str(tmp_path / "mem" / "source")), job)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("a b\n")
    SourcePipeline(spark, client, tmp_path / "df", policy=FAST).run(spark.read.text(str(tmp_path / "in")), job)
    with pytest.raises(ValueError, match="belongs to a run over a DataFrame source"):
        SourcePipeline(spark, client, tmp_path / "df").run(records_from(["a b"]), job)
    with pytest.raises(ValueError, match="names a DataFrame column"):
        SourcePipeline(spark, client, tmp_path / "new").run(records_from(["a b"]), job, key="key")


# -- the copy, without Spark ------------------------------------------------------------


def test_copy_refuses_duplicate_keys_bad_items_and_mixed_types(tmp_path: Path) -> None:
    """Bad in-memory sources are refused before any job, with what to do; nothing half-written is left."""
    with pytest.raises(DuplicateIdentity, match="1 records .* repeat another record's key"):
        write_records([("a", "x"), ("b", "y"), ("a", "z")], tmp_path / "source", 2)
    with pytest.raises(TypeError, match="not a Record or a \\(key, value\\) pair: wrap plain values"):
        write_records(["just a value"], tmp_path / "source", 2)
    with pytest.raises(TypeError, match="one Arrow type"):
        write_records([("a", "x"), ("b", 3)], tmp_path / "source", 2, chunk_rows=1)
    with pytest.raises(TypeError, match="spark.read.text"):
        write_records("in/", tmp_path / "source", 2)  # type: ignore[arg-type]
    assert not (tmp_path / "source").exists()


def test_copy_streams_the_source_in_chunks(tmp_path: Path) -> None:
    """The driver holds one chunk at a time: records are written before the rest of the source is drawn."""
    written_when: list[int] = []

    def source() -> Iterator[Record]:
        for index in range(100):
            if index == 50:
                written_when.append(sum(1 for _ in (tmp_path / "source.tmp").glob("*.parquet")))
            yield Record(f"k{index}", {"n": index})

    assert write_records(source(), tmp_path / "source", 2, chunk_rows=10) == 100
    assert written_when == [2]  # both files had row groups on disk by record 50
    table = pq.read_table(tmp_path / "source").sort_by("key")
    assert table.num_rows == 100 and table.column("value").type == pa.struct([("n", pa.int64())])
    assert not (tmp_path / "source.tmp").exists()


@pytest.mark.connect
def test_in_memory_source_over_connect(
    connect_spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """Spark Connect: the copy is read on the Connect server's executors, failed words replayed from it."""
    records = list(generated_sentences(120))
    job, _ = build_source_job(ackers.addresses, db, injection=FailureInjection(fail_percent=1.0))
    stats = SourcePipeline(connect_spark, client, tmp_path / "checkpoint", policy=PERSISTENT).run(iter(records), job)
    assert (stats.copied, stats.emitted, stats.acked, stats.pending) == (120, 120, 120, 0) and stats.replayed > 0
    assert sink_counts(db) == expected_counts(records)
