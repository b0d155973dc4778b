"""Real speculative execution: a 2-host standalone Spark with spark.speculation on, in a process of its own.

The job (speculation_job.py) runs once for the module; each test checks one
part of its JSON result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from .standalone import can_bind, loopback_hosts

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("speculation_job.py")
# A hang guard for the whole run (Spark, ackers, the job), not a speed check.
RUN_CAP_SECONDS = 240

Attempts = dict[int, dict[str, dict[str, Any]]]


def run_job(work_dir: Path) -> dict[str, Any]:
    """Run speculation_job.py in its own process group and return the JSON it prints."""
    proc = subprocess.Popen(
        [sys.executable, str(JOB), "--work-dir", str(work_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # so a hung run can be stopped with all its children
    )
    try:
        out, err = proc.communicate(timeout=RUN_CAP_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"speculation job still running after {RUN_CAP_SECONDS} s; stderr tail:\n{err[-4000:]}")
    assert proc.returncode == 0, f"speculation job exited {proc.returncode}; stderr tail:\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job's result."""
    if not all(can_bind(host) for host in loopback_hosts(2)):
        pytest.skip("needs 127.0.0.2 on the loopback device (Linux) for a second Spark worker host")
    return run_job(tmp_path_factory.mktemp("speculation"))


def attempts(result: dict[str, Any], stage: str, partition: int) -> Attempts:
    """attempt number -> event name -> event, for one task of the first Spark job."""
    first = min(e["spark_stage"] for e in result["events"] if e["stage"] == stage)
    by_attempt: Attempts = defaultdict(dict)
    for event in result["events"]:
        if (event["spark_stage"], event["partition"]) == (first, partition):
            by_attempt[event["attempt"]][event["event"]] = event
    return dict(by_attempt)


def test_speculative_copies_ran_on_the_other_host(result: dict[str, Any]) -> None:
    """Both slow split tasks got a speculative attempt 1, started on the host their attempt 0 was not on."""
    for partition in (result["slow_after_commit"], result["stalled"]):
        runs = attempts(result, "split", partition)
        assert sorted(runs) == [0, 1], (partition, runs)
        assert runs[0]["started"]["host"] != runs[1]["started"]["host"]


def test_duplicate_commit_of_a_speculative_copy_is_deduplicated(result: dict[str, Any]) -> None:
    """Attempt 0 applied its acks; the speculative attempt 1 sent the same acks and all were deduplicated."""
    runs = attempts(result, "split", result["slow_after_commit"])
    first, second = runs[0]["committed"], runs[1]["committed"]
    roots = first["inputs"]  # one sentence = one tree = one folded ack
    assert roots > 0 and second["inputs"] == roots
    assert (first["applied"], first["deduplicated"]) == (roots, 0)
    assert (second["applied"], second["deduplicated"]) == (0, roots)


def test_killed_original_applied_nothing(result: dict[str, Any]) -> None:
    """The stalled attempt 0 held acks, was killed by Spark and never committed; attempt 1 applied them all."""
    runs = attempts(result, "split", result["stalled"])
    assert runs[0]["stalled"]["held"] > 0
    assert "committed" not in runs[0]
    assert result["stalled_attempt_killed"] is True
    winner = runs[1]["committed"]
    assert (winner["applied"], winner["deduplicated"]) == (winner["inputs"], 0)


def test_every_record_acked_once(result: dict[str, Any]) -> None:
    """Every record ends ACKED on its first delivery with its words in the sink; nothing replayed."""
    records = result["records"]
    assert result["sink_matches_expected"] is True
    stats = result["stats"]
    assert (stats["emitted"], stats["acked"], stats["attempts"]) == (records, records, records)
    for key in ("failed", "timed_out", "lost", "replayed", "dead_lettered", "job_errors"):
        assert stats[key] == 0, key


def test_ackers_saw_no_stuck_tree_and_every_duplicate(result: dict[str, Any]) -> None:
    """The ackers' counters: every tree acked, none failed, timed out or pending; dedups match the commits'."""
    acker, records = result["acker"], result["records"]
    assert acker["acker_trees_initialized_total"] == records
    assert acker["acker_outcomes_total{acked}"] == records
    assert acker["acker_outcomes_total{failed}"] == acker["acker_outcomes_total{timed_out}"] == 0
    assert acker["acker_pending_trees"] == 0
    committed = [e for e in result["events"] if e["event"] == "committed"]
    assert all(e["dropped"] == 0 for e in committed)
    # Any other task Spark chose to speculate adds its own deduplicated acks to both sides.
    assert acker["acker_operations_deduplicated_total"] == sum(e["deduplicated"] for e in committed) >= 1
