"""acker-bench --mode redrive at a tiny size, on the shared SparkSession: every letter acked, each exactly once."""

from __future__ import annotations

import json
from typing import Any

import pytest
from acker_bench.cli import main

pytestmark = pytest.mark.spark


def test_redrive_bench_reports_each_letter_exactly_once(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--mode", "redrive", "--records", "600", "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert (result["records"], result["acked"], result["dead"], result["sink_rows"]) == (600, 600, 0, 600)
    assert result["exactly_once"] is True
    assert result["seconds"] > 0 and result["records_per_s"] > 0 and result["run_seconds"] > 0


def test_redrive_bench_refuses_a_bad_rate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--mode", "redrive", "--records", "10", "--rate", "0"]) == 2
    assert "--rate must be a positive number of records per second" in capsys.readouterr().err
