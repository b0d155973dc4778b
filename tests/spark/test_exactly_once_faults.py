"""Exactly-once output under kill -9: an acker, the driver and an executor's Python worker, once each.

A scaled-down ``acker-bench --mode exactly-once`` run (its driver in a
subprocess, the ackers as processes): the words of a few thousand keyed
records go to a partitioned Parquet folder and to a catalog table while each
kind of process is killed once, after at least 20% of the output rows were
staged. Each destination must hold every word row once, each record's rows
from one delivery. The run's speed is measured by the bench, not here.
"""

from __future__ import annotations

import pytest
from acker_bench.exactly_once import ExactlyOnceConfig, run_exactly_once

pytestmark = [pytest.mark.spark, pytest.mark.chaos]

RECORDS = 6000


def test_every_row_once_after_killing_an_acker_the_driver_and_an_executor() -> None:
    """One mixed run, both destinations: 0 duplicates, 0 missing, one delivery per record, every kill landed."""
    config = ExactlyOnceConfig(
        records=RECORDS,
        kills=1,
        per_kind=False,  # the mixed run only: executor, acker, then the driver during the table's commit
        message_timeout=5.0,  # a killed acker's trees are replayed at the backstop (about 9 s)
        tasks=12,  # per job: the staged rows grow task by task
        batch_rows=100,  # many small batches: the kills land while tasks run
    )
    result = run_exactly_once(config)
    (run,) = result["runs"]
    assert run.get("error") is None, run.get("error")
    assert run["faults"] == {"acker": 1, "driver": 1, "executor": 1}
    assert all(at >= config.first_at for at in run["fault_progress"])
    assert run["driver_starts"] == 2
    assert run["table_found_by_last_driver"] is True  # the killed driver created it; the catalog kept it
    for sink in ("parquet", "table"):
        figures = run["sinks"][sink]
        assert figures["dead_lettered"] == 0, figures
        assert figures["expected_rows"] == 3 * RECORDS  # 1-5 words a record, 3 on average
        assert (figures["duplicates"], figures["missing"], figures["unexpected"]) == (0, 0, 0), figures
        assert figures["output_rows"] == figures["expected_rows"]
        assert figures["mixed_attempts"] == 0, figures
    # The kills did force replays (a killed worker's task left records unstaged), so "one delivery" was tested.
    assert sum(run["sinks"][sink]["rows_from_replays"] for sink in ("parquet", "table")) > 0
    assert run["ok"] and result["ok"]


@pytest.mark.timeout(600)  # two runs of two driver processes each (a JVM start apiece)
def test_every_row_once_after_killing_the_driver_while_its_commit_rewrites_and_publishes_files() -> None:
    """kill -9 of the driver while its Parquet commit rewrites a file holding a failed delivery's rows, and after it
    moved one file into place: a new driver finishes each commit, every row once, from the delivery that ACKED."""
    config = ExactlyOnceConfig(
        records=2000,
        faults=("rewrite", "publish"),
        kills=1,
        sinks=("parquet",),
        message_timeout=5.0,
        tasks=4,
        batch_rows=200,
    )
    result = run_exactly_once(config)
    rewrite, publish = result["runs"]
    for run, kind in ((rewrite, "rewrite"), (publish, "publish")):
        assert run.get("error") is None, run.get("error")
        assert run["faults"] == {kind: 1} and run["driver_starts"] == 2
        figures = run["sinks"]["parquet"]
        assert (figures["duplicates"], figures["missing"], figures["unexpected"]) == (0, 0, 0), figures
        assert figures["output_rows"] == figures["expected_rows"] and figures["mixed_attempts"] == 0, figures
    assert rewrite["sinks"]["parquet"]["rows_from_replays"] > 0  # the failed first deliveries' rows were left out
    assert result["ok"]
