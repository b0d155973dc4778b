"""SourcePipeline under real speculation: a speculative copy of a reading task re-sends identical inits (no false ack)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .standalone import can_bind, loopback_hosts

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("source_speculation_job.py")
RUN_CAP_SECONDS = 300  # a hang guard for the whole run, not a speed check


def test_speculative_reading_task_acks_every_record_once(tmp_path: Path) -> None:
    """Both attempts of the stalled reading task ran; every line acked once, no replay, sink exact."""
    if not all(can_bind(host) for host in loopback_hosts(2)):
        pytest.skip("needs 127.0.0.2 on the loopback device (Linux) for a second Spark worker host")
    proc = subprocess.Popen(
        [sys.executable, str(JOB), "--work-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=RUN_CAP_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the speculation run did not finish; stderr tail:\n{err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    result = json.loads(out.strip().splitlines()[-1])
    attempts_of_0 = {mark.split("-")[1] for mark in result["marks"] if mark.startswith("p0-")}
    assert attempts_of_0 == {"a0", "a1"}, result["marks"]  # the speculative copy really ran
    assert result["partition_0_logs"] == 2 and result["duplicates"] == 0
    stats = result["stats"]
    assert (stats["emitted"], stats["acked"], stats["replayed"], stats["pending"]) == (80, 80, 0, 0)
    assert result["sink_exact"] is True
