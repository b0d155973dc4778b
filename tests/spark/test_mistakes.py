"""Ordinary mistakes lose no record: a forgotten output, a job that writes for itself, a redrive from the shell.

Each test runs real ackers, real local Spark and a real output folder, and
checks what ends in the output, in the dead letters and in the checkpoint
afterwards, and that the error names the mistake.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_protocol.wire import Outcome
from acker_spark import ArrowBolt, DeadLetterStore, ReplayPolicy, Select, close_clients
from acker_spark.executor_read.source_pipeline import JobWritesItself, OutputForgotten, SourcePipeline
from acker_spark.output import FileOutput
from acker_spark.tracking.checkpoint import Checkpoint
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

FAST = ReplayPolicy(max_attempts=2, backoff_base=0.05, backoff_cap=0.1)
HERE = Path(__file__).parent


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Two in-process ackers with a timeout no job here reaches."""
    with local_cluster(2, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


@pytest.fixture
def job_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The job module the shell redrive imports (``redrive_job``), on the path as a user's would be."""
    monkeypatch.syspath_prepend(str(HERE))
    import redrive_job

    return redrive_job


def orders(spark: Any, count: int, comma: int = 0, broken: int = 0) -> Any:
    """``count`` orders ``(id, amount text)``; every ``comma``-th has a decimal comma, every ``broken``-th no number."""
    rows = []
    for i in range(count):
        amount = f"{i}.5"
        if comma and i % comma == 3:
            amount = f"{i},5"
        if broken and i % broken == 7:
            amount = "n/a"
        rows.append((f"k{i:05d}", amount))
    return spark.createDataFrame(rows, "id string, amount string").repartition(4)


def _strict(batch: pa.RecordBatch, collector: Any) -> None:
    """The night's parser: a decimal comma raises ValueError (the bug a redrive fixes)."""
    ids = batch.column("id").to_pylist()
    amounts = [float(text) for text in batch.column("amount").to_pylist()]
    collector.emit(
        {"id": pa.array(ids), "amount": pa.array(amounts), "bucket": pa.array([key[-1] for key in ids])},
        anchors=pa.array(range(len(ids)), pa.int32()),
    )


def strict_job(addresses: Any) -> Any:
    bolt = ArrowBolt(_strict, addresses, schema="id string, amount double, bucket string", name="parse")
    return lambda df: bolt.apply_df(df)


def ids_in(spark: Any, out: Path) -> Counter[str]:
    """Each id in the output folder, with how many rows hold it."""
    if not out.exists():
        return Counter()
    return Counter(row["id"] for row in spark.read.parquet(str(out)).select("id").collect())


def source_done(checkpoint: Path) -> bool | None:
    """The checkpoint's ``source_done`` (None: no checkpoint was written)."""
    manifest = Checkpoint(checkpoint).manifest("source")
    return None if manifest is None else bool(manifest.source and manifest.source.source_done)


# -- a forgotten output ----------------------------------------------------------------------------


def test_a_forgotten_output_stops_before_reading_and_the_fixed_run_writes_every_row(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """The job returns its DataFrame to a pipeline without output=: stopped at once naming output=, nothing marked."""
    out, cp = tmp_path / "out", tmp_path / "cp"
    forgot = SourcePipeline(spark, client, cp, policy=FAST)
    with pytest.raises(OutputForgotten, match=r"no output=.*Pass output=FileOutput"):
        forgot.run(orders(spark, 60), strict_job(ackers.addresses), key="id")
    assert source_done(cp) is None  # nothing read, nothing marked done
    assert ids_in(spark, out) == Counter()

    fixed = SourcePipeline(spark, client, cp, policy=FAST, output=FileOutput(str(out), partition_by=["bucket"]))
    stats = fixed.run(orders(spark, 60), strict_job(ackers.addresses), key="id")
    assert (stats.emitted, stats.acked, stats.dead_lettered) == (60, 60, 0)
    assert ids_in(spark, out) == Counter({f"k{i:05d}": 1 for i in range(60)})
    assert source_done(cp) is True


def test_a_checkpoint_marked_done_with_nothing_read_is_read_again(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run whose job ran no action read nothing; the next run on that checkpoint says so and reads the source."""
    out, cp = tmp_path / "out", tmp_path / "cp"
    SourcePipeline(spark, client, cp, policy=FAST).run(orders(spark, 40), lambda df: None, key="id")
    assert source_done(cp) is True  # done: every record read (none) settled

    fixed = SourcePipeline(spark, client, cp, policy=FAST, output=FileOutput(str(out)))
    with caplog.at_level(logging.WARNING, logger="acker_spark.executor_read.source_pipeline"):
        stats = fixed.run(orders(spark, 40), strict_job(ackers.addresses), key="id")
    assert "marked done by a run that read no record" in caplog.text
    assert (stats.emitted, stats.acked) == (40, 40)
    assert ids_in(spark, out) == Counter({f"k{i:05d}": 1 for i in range(40)})
    assert source_done(cp) is True


# -- a job that writes for itself ------------------------------------------------------------------


def writing_job(addresses: Any, own: Path) -> Any:
    """The mistake: the job writes the bolt's rows itself and returns nothing."""
    bolt = ArrowBolt(_strict, addresses, schema="id string, amount double, bucket string", name="parse")
    return lambda df: bolt.apply_df(df).write.mode("append").parquet(str(own))


@pytest.mark.parametrize("with_output", [True, False], ids=["with-output", "without-output"])
def test_a_job_writing_for_itself_is_stopped_before_it_writes(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, with_output: bool
) -> None:
    """Found before the first delivery: nothing written, nothing read; the fixed rerun writes each row once."""
    out, own, cp = tmp_path / "out", tmp_path / "own", tmp_path / "cp"
    output = FileOutput(str(out)) if with_output else None
    mistaken = SourcePipeline(spark, client, cp, policy=FAST, output=output)
    with pytest.raises(JobWritesItself, match=rf"writes its output itself \(parquet\('{own}'\)\).*nothing was written"):
        mistaken.run(orders(spark, 50), writing_job(ackers.addresses, own), key="id")
    assert not own.exists() and not out.exists()
    assert source_done(cp) is None
    assert sum(client.describe(shard).pending_trees for shard in range(client.shard_count)) == 0

    fixed = SourcePipeline(spark, client, cp, policy=FAST, output=FileOutput(str(out)))
    stats = fixed.run(orders(spark, 50), strict_job(ackers.addresses), key="id")
    assert (stats.acked, stats.output_rows) == (50, 50)
    assert ids_in(spark, out) == Counter({f"k{i:05d}": 1 for i in range(50)})
    assert not own.exists()


# -- redrive from the shell ------------------------------------------------------------------------


@pytest.fixture
def night(spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path) -> tuple[Path, Path, DeadLetterStore]:
    """A night of 200 orders into a partitioned Parquet folder: 10 with a decimal comma and 2 with no number die."""
    out, cp = tmp_path / "out", tmp_path / "cp"
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    pipeline = SourcePipeline(
        spark,
        client,
        cp,
        policy=FAST,
        dead_letters=letters,
        budget=None,
        output=FileOutput(str(out), partition_by=["bucket"]),
    )
    stats = pipeline.run(orders(spark, 200, comma=20, broken=100), strict_job(ackers.addresses), key="id")
    assert (stats.acked, stats.dead_lettered) == (188, 12)
    return out, cp, letters


def shell_redrive(ackers: Any, letters: DeadLetterStore, cp: Path, *extra: str) -> tuple[int, list[str]]:
    """``acker-ctl dead-letters redrive`` of the ValueError letters through ``redrive_job:make_output_job``."""
    from acker_ctl.cli import main

    printed: list[str] = []
    code = main(
        [
            "--ackers",
            ",".join(ackers.addresses),
            "--json",
            "dead-letters",
            "redrive",
            "--store",
            str(letters.path),
            "--job",
            "redrive_job:make_output_job",
            "--checkpoint",
            str(cp),
            "--cause",
            "ValueError",
            *extra,
        ],  # fmt: skip
        out=printed.append,
    )
    return code, printed


def test_shell_redrive_commits_each_redriven_record_once_then_marks_its_letter(
    spark: Any,
    ackers: Any,
    night: tuple[Path, Path, DeadLetterStore],
    job_module: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--output parquet:PATH --partition-by bucket: the 10 fixed orders land once, marked acked after the commit."""
    import json

    out, cp, letters = night
    seen_at_mark: list[Counter[str]] = []
    real_mark = DeadLetterStore.mark

    def mark(self: DeadLetterStore, *args: Any) -> int:
        seen_at_mark.append(ids_in(spark, out))  # what a reader sees when the letters are marked
        return real_mark(self, *args)

    monkeypatch.setattr(DeadLetterStore, "mark", mark)
    code, printed = shell_redrive(ackers, letters, cp, "--output", f"parquet:{out}", "--partition-by", "bucket")
    assert code == 0, printed
    result = json.loads(printed[0])
    assert {k: result[k] for k in ("claimed", "redriven", "acked", "dead", "still_failing")} == {
        "claimed": 12,
        "redriven": 12,
        "acked": 10,
        "dead": 2,
        "still_failing": 0,
    }
    every = Counter({f"k{i:05d}": 1 for i in range(200) if i % 100 != 7})
    assert ids_in(spark, out) == every  # each fixed order once, the rest as the night wrote them
    assert seen_at_mark == [every]  # the rows were committed before any letter was marked
    statuses = Counter(letter.redrive_status for letter in letters.all())
    assert statuses == Counter({"acked": 10, "dead": 2})
    assert {letter.key for letter in letters.all() if letter.redrive_status == "dead"} == {"k00007", "k00107"}
    chunks = list((cp / "redrives").glob("*/chunk-*/checkpoint"))
    assert len(chunks) == 1 and source_done(chunks[0]) is True


def test_shell_redrive_of_a_job_returning_rows_without_an_output_is_refused(
    spark: Any,
    ackers: Any,
    night: tuple[Path, Path, DeadLetterStore],
    job_module: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No --output: refused before a letter is sent, naming --output; no letter marked, the output unchanged."""
    out, cp, letters = night
    before = ids_in(spark, out)
    code, printed = shell_redrive(ackers, letters, cp)
    assert code == 1, printed
    err = capsys.readouterr().err
    assert "OutputForgotten" in err and "--output FORMAT:PATH" in err and "not started" in err
    assert {letter.redrive_status for letter in letters.all()} == {None}  # selectable again, none acked
    assert ids_in(spark, out) == before and len(before) == 188

    code, printed = shell_redrive(ackers, letters, cp, "--output", f"parquet:{out}", "--partition-by", "bucket")
    assert code == 0, printed
    assert ids_in(spark, out) == Counter({f"k{i:05d}": 1 for i in range(200) if i % 100 != 7})


def test_a_redrive_meeting_records_still_failing_ends_every_letter(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, job_module: Any
) -> None:
    """150 letters, 10 of them still not numbers: the redrive's own budget (none) lets it finish; no letter stuck."""
    out, cp = tmp_path / "out", tmp_path / "cp"
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    for i in range(150):
        amount = "n/a" if i % 15 == 4 else f"{i},5"
        letters.add(f"k{i:05d}", {"id": f"k{i:05d}", "amount": amount}, Outcome.FAILED, 2, f"ValueError: {amount!r}")
    pipeline = SourcePipeline(spark, client, cp, policy=FAST, output=FileOutput(str(out), partition_by=["bucket"]))
    report = pipeline.redrive(letters, job_module.make_output_job(ackers.addresses), select=Select(cause="ValueError"))
    assert (report.sent, report.acked, report.dead, report.still_failing) == (150, 140, 10, 0)
    assert ids_in(spark, out) == Counter({f"k{i:05d}": 1 for i in range(150) if i % 15 != 4})
    assert Counter(letter.redrive_status for letter in letters.all()) == Counter({"acked": 140, "dead": 10})
    chunks = list((cp / "redrives").glob("*/chunk-*/checkpoint"))
    assert len(chunks) == 1 and source_done(chunks[0]) is True
