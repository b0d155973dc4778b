"""acker-bench --mode pipeline at a tiny size, on the shared SparkSession: every figure is reported and every sink exact."""

from __future__ import annotations

import json
from typing import Any

import pytest
from acker_bench.cli import main

pytestmark = pytest.mark.spark


def test_pipeline_bench_reports_plain_and_tracked(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Plain and tracked runs over the same files both end exact; the figures are there."""
    code = main(["--mode", "pipeline", "--records", "1500", "--files", "2", "--rounds", "1", "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert result["sink_exact"] is True and not any(key.startswith("driver_fed") for key in result)
    assert (result["tracked_acked"], result["tracked_replayed"]) == (1500, 0)
    # The ratio is of the unrounded times, the seconds are printed rounded: equal to within that rounding.
    assert result["tracked_over_plain"] == pytest.approx(result["tracked_seconds"] / result["plain_seconds"], rel=5e-3)
    for key in ("driver_cpu_us_per_record", "plain_driver_cpu_us_per_record", "driver_rss_bytes_after_tracked"):
        assert result[key] > 0
    assert result["record_table_bytes"] >= 1500 * 8  # at least the roots


def test_pipeline_bench_reader_only_row_runs_the_reading_step_untracked(
    spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """--reader-only adds the job behind the untracked reading step: its sink is exact and its figures are there."""
    code = main(
        ["--mode", "pipeline", "--records", "800", "--files", "2", "--rounds", "1", "--reader-only"] + ["--json"]
    )
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert result["reader_only_sink_exact"] is True and result["sink_exact"] is True
    assert len(result["reader_only_rounds_seconds"]) == 1
    assert result["reader_only_over_plain"] == pytest.approx(
        result["reader_only_seconds"] / result["plain_seconds"], rel=5e-3
    )


def test_pipeline_bench_refuses_nonsense_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    """--records 0 is refused before anything starts."""
    assert main(["--mode", "pipeline", "--records", "0"]) == 2
    assert "--records" in capsys.readouterr().err


def test_pipeline_bench_parquet_sink_compares_plain_and_exactly_once_output(
    spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """--sink parquet: plain df.write.parquet and FileOutput hold the same rows; the commit is a part of the run."""
    code = main(
        ["--mode", "pipeline", "--sink", "parquet", "--records", "1200", "--files", "2", "--rounds", "1", "--json"]
    )
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert result["sink_exact"] is True and result["tracked_acked"] == 1200
    assert result["output_rows"] > 1200  # several words a line
    assert 0 < result["commit_seconds"] < result["tracked_seconds"]
    assert result["tracked_before_commit_seconds"] == pytest.approx(
        result["tracked_seconds"] - result["commit_seconds"], abs=2e-3
    )
    assert result["output_files"] >= 1 and result["output_bytes"] > 0  # the tracked output, as published
    assert result["spark_exactly_once_seconds"] > 0  # Spark's own exactly-once file sink, same run, same rows
    assert result["tracked_over_spark_exactly_once"] == pytest.approx(
        result["tracked_seconds"] / result["spark_exactly_once_seconds"], rel=5e-3
    )
    assert result["driver_cpu_us_per_record"] > 0
    # One Python pass each: the tracked job reads, splits and stages in one step, as the plain job splits.
    assert result["tracked_python_steps"] == result["plain_python_steps"] == 1


def test_pipeline_bench_parquet_sink_refuses_reader_only(capsys: pytest.CaptureFixture[str]) -> None:
    """--reader-only belongs to the SQLite word count: refused before anything starts."""
    assert main(["--mode", "pipeline", "--sink", "parquet", "--reader-only"]) == 2
    assert "--reader-only" in capsys.readouterr().err
