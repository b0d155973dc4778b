"""The acker-demo job at a small size, in-process on the shared SparkSession, checked through --json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from acker_demo.cli import main, parse_args
from acker_demo.wordcount import FailureInjection

pytestmark = pytest.mark.spark


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """Run the demo's main() and parse its one JSON line."""
    code = main(["--json", *argv])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines
    return code, json.loads(lines[0])


@pytest.mark.chaos
def test_demo_with_faults_injected(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Failed words, a crashed task, a killed acker: all acked or dead-lettered, sink exact, exit 0."""
    code, summary = run_main(
        capsys,
        "--records",
        "120",
        "--fail-percent",
        "5",
        "--crash-task",
        "--kill-acker-after",
        "1",
        "--restart-after",
        "1",
        # As --spark-read's test: a round (read, split, shuffle, count) on a loaded machine outlasts 3 s.
        "--message-timeout",
        "5",
        "--backoff",
        "0.05",
        "--db",
        str(tmp_path / "demo.sqlite"),
    )
    assert code == 0
    assert summary["mode"] == "tracked"
    assert summary["emitted"] == summary["records"] == 120
    assert summary["acked"] + summary["dead_lettered"] == 120
    assert summary["replayed"] > 0 and summary["failed"] > 0  # 5% of ~900 words fail once
    assert summary["sink_matches_expected"] is True
    assert (tmp_path / "demo.sqlite.crashed").exists()  # the one injected crash happened
    for key in ("timed_out", "lost", "attempts", "wall_seconds", "pipeline_seconds", "acker_killed"):
        assert key in summary


def test_demo_untracked_from_a_directory(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--no-tracking over --source-dir runs the same pipeline with no acker and still matches the input."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.txt").write_text("the quick brown fox\njumps over\n\nthe lazy dog\n")
    (source / "b.txt").write_text("dog eat dog\n")
    code, summary = run_main(capsys, "--no-tracking", "--source-dir", str(source), "--db", str(tmp_path / "u.sqlite"))
    assert code == 0
    assert (summary["mode"], summary["records"], summary["acked"]) == ("untracked", 4, 4)
    assert summary["words_in_sink"] == summary["words_expected"] == 12
    assert summary["sink_matches_expected"] is True


def test_a_crash_marker_crashes_one_task_of_the_run(tmp_path: Path) -> None:
    """--crash-task crashes the first attempt of one task per run, not one in every Spark job of it."""
    marker = tmp_path / "sink.sqlite.crashed"
    once = FailureInjection(crash_partition=0, crash_marker=str(marker))
    assert not once.crashes(1, 0) and not once.crashes(0, 1)  # another partition, a retry: no crash, no marker
    assert not marker.exists()
    assert once.crashes(0, 0) and marker.exists()
    assert not once.crashes(0, 0)  # the next job's first attempt of the same partition runs on
    every_job = FailureInjection(crash_partition=0)
    assert every_job.crashes(0, 0) and every_job.crashes(0, 0)


def test_demo_refuses_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """Nonsense flag values exit with status 2 and a message naming the flag."""
    with pytest.raises(SystemExit) as exc:
        parse_args(["--fail-percent", "150"])
    assert exc.value.code == 2
    assert "--fail-percent" in capsys.readouterr().err


def test_demo_dataframe_with_faults(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--dataframe (ArrowBolts) with failed words and a crashed task: all acked or dead-lettered, sink exact."""
    code, summary = run_main(
        capsys,
        "--dataframe",
        "--records",
        "120",
        "--fail-percent",
        "5",
        "--crash-task",
        "--kill-acker-after",
        "0",
        "--max-pending",
        "60",
        "--backoff",
        "0.05",
        "--db",
        str(tmp_path / "df.sqlite"),
    )
    assert code == 0
    assert (summary["mode"], summary["api"]) == ("tracked", "dataframe")
    assert summary["emitted"] == summary["records"] == 120
    assert summary["acked"] + summary["dead_lettered"] == 120
    assert summary["replayed"] > 0 and summary["failed"] > 0  # 5% of ~900 words fail once
    assert summary["sink_matches_expected"] is True
    assert (tmp_path / "df.sqlite.crashed").exists()  # the one injected crash happened


def test_demo_dataframe_untracked(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--dataframe --no-tracking runs the same ArrowBolt job with addresses=None and matches the input."""
    code, summary = run_main(
        capsys, "--dataframe", "--no-tracking", "--records", "50", "--db", str(tmp_path / "u.sqlite")
    )
    assert code == 0
    assert (summary["mode"], summary["api"], summary["acked"]) == ("untracked", "dataframe", 50)
    assert summary["sink_matches_expected"] is True


@pytest.mark.parametrize("api", ["rdd", "dataframe"])
def test_compare_untracked_reports_both_modes_and_their_ratio(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], api: str
) -> None:
    """--compare-untracked 1 runs untracked then tracked on one session: both times, the ratio, every run exact."""
    extra = ["--dataframe"] if api == "dataframe" else []
    code, summary = run_main(
        capsys,
        "--compare-untracked",
        "1",
        "--records",
        "60",
        "--fail-percent",
        "0",
        "--no-crash-task",
        "--kill-acker-after",
        "0",
        "--db",
        str(tmp_path / "demo.sqlite"),
        *extra,
    )
    assert code == 0
    assert summary["mode"] == "compare" and summary["api"] == api and summary["rounds"] == 1
    untracked, tracked = summary["untracked_pipeline_seconds"], summary["tracked_pipeline_seconds"]
    assert len(untracked) == len(tracked) == 1
    assert summary["tracked_over_untracked"] == round(tracked[0] / untracked[0], 3)
    assert summary["acked"] == 60 and summary["sink_matches_expected"] is True


def test_compare_untracked_refuses_no_tracking() -> None:
    """Asking for a comparison and for no tracking at once is a usage error, not a silent single run."""
    with pytest.raises(SystemExit):
        parse_args(["--compare-untracked", "2", "--no-tracking"])


def test_demo_spark_read_with_faults(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--spark-read (make demo): records read by spark.read, failed words, a crashed task, a killed acker: the
    Parquet output the pipeline commits holds each word row of each acked record exactly once."""
    code, summary = run_main(
        capsys,
        "--spark-read",
        "--records",
        "120",
        "--fail-percent",
        "3",
        "--crash-task",
        "--kill-acker-after",
        "1",
        "--restart-after",
        "1",
        "--message-timeout",
        "5",
        "--backoff",
        "0.05",
        "--db",
        str(tmp_path / "read.sqlite"),
    )
    assert code == 0
    assert (summary["mode"], summary["api"]) == ("tracked", "spark-read")
    assert summary["emitted"] == summary["records"] == 120
    assert summary["acked"] + summary["dead_lettered"] == 120
    assert summary["replayed"] > 0
    assert summary["sink_matches_expected"] is True
    assert (tmp_path / "read.sqlite.crashed").exists()  # the one injected crash happened
    assert Path(summary["checkpoint"], "manifest.json").is_file()
    # Ended with Spark's Parquet writer: every word row of every acked record once, nothing else.
    assert summary["output_duplicates"] == 0 and summary["output_rows"] == summary["words_expected"] > 0
    assert spark.read.parquet(summary["output"]).count() == summary["output_rows"]


def test_demo_spark_read_refuses_untracked(capsys: pytest.CaptureFixture[str]) -> None:
    """--spark-read is the tracked SourcePipeline: --no-tracking with it is refused, naming the benchmark to use."""
    with pytest.raises(SystemExit) as exc:
        parse_args(["--spark-read", "--no-tracking"])
    assert exc.value.code == 2
    assert "acker-bench --mode pipeline" in capsys.readouterr().err


def test_demo_from_a_redis_stream(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--source redis: the records published to a Redis stream the demo starts, drained by SourcePipeline; each
    message acked at Redis (or dead-lettered there) after its rows are committed, the output exact."""
    code, summary = run_main(
        capsys,
        "--source",
        "redis",
        "--records",
        "60",
        "--fail-percent",
        "3",
        "--max-attempts",
        "2",
        "--backoff",
        "0.05",
        "--db",
        str(tmp_path / "redis.sqlite"),
    )
    assert code == 0
    assert (summary["api"], summary["source"]) == ("spark-read", "redis")
    assert summary["acked"] + summary["dead_lettered"] == summary["records"] == 60
    assert (
        summary["acked_at_broker"] == summary["acked"]
        and summary["dead_lettered_at_broker"] == summary["dead_lettered"]
    )
    assert summary["sink_matches_expected"] is True and summary["output_duplicates"] == 0
