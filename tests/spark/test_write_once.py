"""Exactly-once Parquet output written once: the tasks' files are published by rename, rewritten only where needed."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.output import FileOutput, published_files
from acker_spark.output import publish as publish_module
from pyspark import cloudpickle

from .test_output import FAST, expected_words, keyed_source, rows_of, split_job

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark


@pytest.fixture
def ackers(patient_ackers: Any) -> Any:
    """The ackers of this module: a timeout no job here reaches (conftest's ``patient_ackers``)."""
    return patient_ackers


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every staged file a commit reads back (a rename reads none)."""
    seen: list[Path] = []
    monkeypatch.setattr(publish_module, "READS", [seen.append])
    return seen


class StagedInodes(SourcePipeline):
    """Notes the inode of every staged data file just before the run's commits."""

    inodes: set[int]

    def _commit_acked(self) -> None:
        assert self._output is not None
        root = Path(self._output.commits.area.root)
        self.inodes = {os.stat(p).st_ino for p in root.rglob("*.parquet")} if root.is_dir() else set()
        super()._commit_acked()


def test_a_commit_of_acked_deliveries_publishes_the_staged_files_without_reading_them(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, reads: list[Path]
) -> None:
    """Every delivery ACKED: each published file is the very file a task wrote (same inode), no row read back."""
    out = tmp_path / "out"
    pipeline = StagedInodes(spark, client, tmp_path / "cp", policy=FAST, output=FileOutput(str(out)))
    stats = pipeline.run(keyed_source(spark, 200), split_job(ackers.addresses), key="id")
    assert rows_of(spark.read.parquet(str(out))) == expected_words(200)
    assert stats.output_rows == sum(expected_words(200).values())
    published = published_files(out)
    assert published and {os.stat(p).st_ino for p in published} <= pipeline.inodes
    assert reads == []
    assert len(published) <= 4  # one file per task (4 partitions), not one per Arrow batch


def test_a_file_holding_a_failed_deliverys_rows_is_rewritten_without_them(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, reads: list[Path]
) -> None:
    """Records failed on their first delivery: the files holding those rows are rewritten; each row once."""
    out = tmp_path / "out"
    pipeline = StagedInodes(spark, client, tmp_path / "cp", policy=FAST, output=FileOutput(str(out)))
    stats = pipeline.run(keyed_source(spark, 200), split_job(ackers.addresses, fail_digit="7"), key="id")
    assert stats.replayed == 20
    assert rows_of(spark.read.parquet(str(out))) == expected_words(200)
    assert stats.output_rows == sum(expected_words(200).values())
    assert reads  # the first round's files held failed deliveries' rows beside acked ones
    assert all("/r00000/" in str(p) for p in reads)  # and only those were read back
    inodes = {os.stat(p).st_ino for p in published_files(out)}
    assert inodes & pipeline.inodes  # the replay round's files were published as they were


class Crash(BaseException):
    """Stands for the driver dying at that point (a BaseException: nothing in the pipeline handles it)."""


def _crash_on_read(path: Path) -> None:
    raise Crash(f"killed while rewriting {path}")


@pytest.mark.chaos
def test_a_driver_killed_while_a_commit_moves_and_rewrites_files_leaves_the_folder_as_it_was(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed while the commit rewrites a file holding failed deliveries' rows (after some moves): a plain reader
    sees nothing of the commit; the next run finishes it with each row once."""
    out = tmp_path / "out"
    output = FileOutput(str(out))
    monkeypatch.setattr(publish_module, "READS", [_crash_on_read])
    with pytest.raises(Crash):
        SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=output).run(
            keyed_source(spark, 120), split_job(ackers.addresses, fail_digit="3"), key="id"
        )
    assert not [p for p in out.rglob("*.parquet") if ".acker-staging" not in str(p)]  # nothing published yet
    monkeypatch.setattr(publish_module, "READS", [])
    stats = SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=output).run(
        keyed_source(spark, 120), split_job(ackers.addresses, fail_digit="3"), key="id"
    )
    assert stats.resumed and stats.rounds == 0
    assert stats.output_rows == sum(expected_words(120).values())  # the finished commit is counted
    assert rows_of(spark.read.parquet(str(out))) == expected_words(120)
    assert sorted(published_files(out)) == sorted(p for p in out.rglob("*.parquet") if ".acker-staging" not in str(p))


@pytest.mark.chaos
def test_a_publish_cut_short_is_finished_from_the_shell_before_any_rerun(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after moving one of a commit's files into place: ``acker-ctl output finish`` completes the commit
    (no Spark, no job), a plain reader then sees every row once, and the next run has nothing left to do."""
    import acker_spark.output.folder_publish as destinations
    from acker_ctl.cli import main as ctl

    out, cp = tmp_path / "out", tmp_path / "cp"
    output = FileOutput(str(out), partition_by=["bucket"])
    real_replace, moves = os.replace, []

    def dying_replace(src: Any, dst: Any) -> None:
        if "-c00000" in str(src):  # the commit's files moving into place
            if len(moves) == 1:
                raise Crash("killed while publishing")
            moves.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(destinations.os, "replace", dying_replace)
    with pytest.raises(Crash):
        SourcePipeline(spark, client, cp, policy=FAST, output=output).run(
            keyed_source(spark, 80), split_job(ackers.addresses), key="id"
        )
    monkeypatch.setattr(destinations.os, "replace", real_replace)
    assert 0 < len(rows_of(spark.read.parquet(str(out)))) < len(expected_words(80))  # part of the commit
    printed: list[str] = []
    assert ctl(["output", "finish", "--checkpoint", str(cp)], printed.append) == 0
    assert printed == [f"commit 0 finished: {sum(expected_words(80).values())} rows"]
    assert rows_of(spark.read.parquet(str(out))) == expected_words(80)
    assert ctl(["output", "finish", "--checkpoint", str(cp)], printed.append) == 0
    assert printed[-1] == "no unfinished commit"
    stats = SourcePipeline(spark, client, cp, policy=FAST, output=output).run(
        keyed_source(spark, 80), split_job(ackers.addresses), key="id"
    )
    assert stats.rounds == 0 and rows_of(spark.read.parquet(str(out))) == expected_words(80)
