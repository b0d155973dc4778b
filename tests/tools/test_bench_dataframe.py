"""acker-bench --mode dataframe at a tiny size, on the shared SparkSession: both runs complete and report rows/s."""

from __future__ import annotations

import json
from typing import Any

import pytest
from acker_bench.cli import main

pytestmark = pytest.mark.spark


def test_dataframe_bench_reports_tracked_and_untracked(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The tracked run acks every record, the untracked one processes them all, and both report rows/s."""
    code = main(["--mode", "dataframe", "--records", "1500", "--max-pending", "500", "--fan-out", "3", "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert (result["records_acked"], result["records_untracked"], result["replayed"]) == (1500, 1500, 0)
    assert result["tracked_rows_per_s"] > 0 and result["untracked_rows_per_s"] > 0
    assert result["fan_out"] == 3 and result["commit_errors"] == 0
