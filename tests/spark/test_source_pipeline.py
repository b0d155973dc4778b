"""SourcePipeline on local Spark: records read by spark.read on the executors, trees started there, replay by re-reading."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_demo.dataframe_job import build_source_job
from acker_demo.wordcount import FailureInjection, expected_counts, sink_counts
from acker_protocol.wire import Outcome
from acker_spark import DeadLetterStore, ReplayPolicy, close_clients, generated_sentences
from acker_spark.executor_read.source_pipeline import DuplicateIdentity, SourcePipeline
from acker_spark.sqlite import open_db
from acker_spark.tracking.identity import UnstableIdentity
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

FAST = ReplayPolicy(max_attempts=4, backoff_base=0.05, backoff_cap=0.2)
# Random per-word failures: 10 draws make a record that fails them all vanishingly unlikely.
PERSISTENT = ReplayPolicy(max_attempts=10, backoff_base=0.05, backoff_cap=0.2)
# A job here (read, split, shuffle, sink) must not outlast the trees it processes.
PATIENT_TIMEOUT = 60.0


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers whose timeout no job here reaches."""
    with local_cluster(3, message_timeout=PATIENT_TIMEOUT) as cluster:
        yield cluster
    close_clients()


def write_lines(folder: Path, count: int, files: int = 3) -> list[str]:
    """``count`` generated sentences over ``files`` text files; returns the lines."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [record.value for record in generated_sentences(count)]
    for index in range(files):
        (folder / f"part-{index}.txt").write_text("".join(f"{line}\n" for line in lines[index::files]))
    return lines


def line_records(lines: list[str]) -> list[tuple[str, str]]:
    """Records for expected_counts (the keys do not matter to it)."""
    return [(str(i), line) for i, line in enumerate(lines)]


def sink_keys(db: Path) -> set[str]:
    """The record keys with at least one word in the sink."""
    with open_db(db) as conn:
        return {key for (key,) in conn.execute("SELECT DISTINCT record_key FROM words")}


def test_text_source_every_line_acked_once_sink_exact(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """spark.read.text in, every line's tree started on the executors, every line acked on its first read."""
    lines = write_lines(tmp_path / "in", 300)
    job, _ = build_source_job(ackers.addresses, db)
    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=FAST)
    stats = pipeline.run(spark.read.text(str(tmp_path / "in")), job)
    assert (stats.emitted, stats.acked, stats.replayed, stats.pending) == (300, 300, 0, 0)
    assert sink_counts(db) == expected_counts(line_records(lines))
    assert len(sink_keys(db)) == len([line for line in lines if line.strip()])


def test_injected_failures_and_a_task_crash_replay_by_rereading(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """Failed words and a crashed sink task: failed lines are re-read by identity until the sink is exact."""
    lines = write_lines(tmp_path / "in", 400)
    injection = FailureInjection(fail_percent=1.0, crash_partition=1, crash_after=20)
    job, _ = build_source_job(ackers.addresses, db, injection=injection)
    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=PERSISTENT)
    stats = pipeline.run(spark.read.text(str(tmp_path / "in")), job)
    assert stats.failed > 0 and stats.replayed >= stats.failed
    assert (stats.emitted, stats.acked, stats.dead_lettered, stats.pending) == (400, 400, 0, 0)
    # Every record's last delivery acked, so its words are all in the sink: a false ack would leave some out.
    assert sink_counts(db) == expected_counts(line_records(lines))


def test_keyed_parquet_dead_letters_keep_identity_and_payload(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """A key column names the records; one that always fails ends as a dead letter with its key and payload."""
    records = [(f"k{i:03d}", record.value) for i, record in enumerate(generated_sentences(60))]
    spark.createDataFrame(records, "key string, value string").write.parquet(str(tmp_path / "pq"))
    job, _ = build_source_job(ackers.addresses, db, injection=FailureInjection(always_fail=frozenset({"k007"})))
    letters = DeadLetterStore(db)
    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=FAST, dead_letters=letters)
    stats = pipeline.run(spark.read.parquet(str(tmp_path / "pq")), job, key="key")
    assert (stats.acked, stats.dead_lettered, stats.replayed) == (59, 1, FAST.max_attempts - 1)
    [letter] = letters.all()
    assert (letter.key, letter.reason, letter.attempts) == ("k007", Outcome.FAILED, FAST.max_attempts)
    assert letter.record["value"] == dict(records)["k007"]
    assert sink_counts(db) == expected_counts([r for r in records if r[0] != "k007"])


def test_parquet_rows_identified_by_file_and_row_index(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """Without a key, Parquet rows are identified by (file, row index): replays find the same rows."""
    records = [(f"x{i:03d}", record.value) for i, record in enumerate(generated_sentences(80))]
    spark.createDataFrame(records, "name string, value string").repartition(3).write.parquet(str(tmp_path / "pq"))
    job, _ = build_source_job(ackers.addresses, db, injection=FailureInjection(fail_percent=2.0))
    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=PERSISTENT)
    stats = pipeline.run(spark.read.parquet(str(tmp_path / "pq")), job)
    assert (stats.emitted, stats.acked) == (80, 80) and stats.replayed > 0
    assert sink_counts(db) == expected_counts(records)
    assert all("#" in key for key in sink_keys(db))  # path#row_index


def test_source_without_stable_identity_is_refused(spark: Any, client: ClusterClient, tmp_path: Path) -> None:
    """spark.range has no file metadata and no key: refused before anything runs, with what to do."""
    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint")
    with pytest.raises(UnstableIdentity, match="key="):
        pipeline.run(spark.range(10), lambda df: df.count())
    with pytest.raises(UnstableIdentity, match="not a column"):
        pipeline.run(spark.range(10), lambda df: df.count(), key="nope")
    assert not (tmp_path / "checkpoint" / "emissions").exists()


def test_duplicate_keys_are_refused(spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path) -> None:
    """Two records with one key would share a root: the run stops with a message naming the column."""
    spark.createDataFrame([("a", "x y"), ("a", "y z"), ("b", "z")], "key string, value string").write.parquet(
        str(tmp_path / "pq")
    )
    job, _ = build_source_job(ackers.addresses, db)
    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=FAST)
    with pytest.raises(DuplicateIdentity, match="'key' is not unique"):
        pipeline.run(spark.read.parquet(str(tmp_path / "pq")).coalesce(1), job, key="key")


def test_changed_source_files_refuse_the_checkpoint(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """A checkpoint of a text source is refused for the same directory once a file changed."""
    write_lines(tmp_path / "in", 30)
    job, _ = build_source_job(ackers.addresses, db)
    SourcePipeline(spark, client, tmp_path / "checkpoint", policy=FAST).run(spark.read.text(str(tmp_path / "in")), job)
    with open(tmp_path / "in" / "part-0.txt", "a") as out:
        out.write("one more line\n")
    again = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=FAST)
    with pytest.raises(UnstableIdentity, match="files changed"):
        again.run(spark.read.text(str(tmp_path / "in")), job)


class CrashingSplit:
    """The split bolt, whose first attempt of partition 0 dies after emitting: Spark re-runs the reading task."""

    def __call__(self, batch: Any, collector: Any) -> None:
        from acker_demo.dataframe_job import split_sentences
        from pyspark import TaskContext

        split_sentences(batch, collector)
        context = TaskContext.get()
        if context is not None and context.partitionId() == 0 and context.attemptNumber() == 0:
            raise RuntimeError("injected crash of the reading task's first attempt")


def test_reading_task_retried_re_sends_identical_inits(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """The task that read and started the trees dies; its retry re-reads and re-inits: no replay, no false ack."""
    from acker_demo.dataframe_job import WORD_SCHEMA, CountWordRows
    from acker_spark import ArrowBolt

    lines = write_lines(tmp_path / "in", 200, files=2)
    split = ArrowBolt(CrashingSplit(), ackers.addresses, schema=WORD_SCHEMA, name="split")
    count = ArrowBolt(CountWordRows(db), ackers.addresses, schema=None, name="count")

    def job(df: Any) -> None:
        words = split.apply_df(df.selectExpr("_record_key AS key", "value", "_attempt AS attempt", "_acker_ids"))
        count.apply_df(words.repartition(3, "word")).count()

    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=FAST)
    stats = pipeline.run(spark.read.text(str(tmp_path / "in")), job)
    assert (stats.emitted, stats.acked, stats.replayed, stats.job_errors) == (200, 200, 0, 0)
    assert sink_counts(db) == expected_counts(line_records(lines))
    # Both attempts logged (each also writes its .keys file).
    assert len(list((tmp_path / "checkpoint" / "emissions" / "r00000").glob("p00000-*.arrow"))) == 2


def test_replayed_records_not_found_again_stop_the_run(
    spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """A replay round that does not find the failed records (here: a job that skips its input) is an error, not a loop."""
    records = [(f"k{i:03d}", record.value) for i, record in enumerate(generated_sentences(20))]
    spark.createDataFrame(records, "key string, value string").write.parquet(str(tmp_path / "pq"))
    job, _ = build_source_job(ackers.addresses, db, injection=FailureInjection(always_fail=frozenset({"k003"})))
    calls = []

    def first_round_only(df: Any) -> None:
        calls.append(1)
        if len(calls) <= 2:  # the run's job check (an empty frame), then the first round
            job(df)

    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=FAST)
    with pytest.raises(UnstableIdentity, match="1 failed records were not found again"):
        pipeline.run(spark.read.parquet(str(tmp_path / "pq")), first_round_only, key="key")
    assert len(calls) == 3  # the check, the first round, the replay round
