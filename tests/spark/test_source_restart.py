"""kill -9 of a SourcePipeline driver mid-job, then a new driver on the same checkpoint finishes the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from acker_client.testing import local_cluster
from acker_demo.wordcount import create_sink, expected_counts, sink_counts
from acker_protocol.wire import Outcome
from acker_spark import close_clients
from acker_spark.sqlite import open_db
from acker_spark.tracking.checkpoint import Checkpoint
from acker_spark.tracking.emission_log import read_round

from .test_source_pipeline import line_records, write_lines

pytestmark = pytest.mark.spark

DRIVER = Path(__file__).with_name("source_driver.py")
RUN_CAP_SECONDS = 300  # a hang guard for one driver run (Spark start, the job), not a speed check


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Ackers that outlive both drivers (the test process hosts them), with a timeout no job reaches."""
    with local_cluster(2, message_timeout=120.0) as cluster:
        yield cluster
    close_clients()


def start_driver(ackers: Any, source: Path, checkpoint: Path, db: Path, run: int) -> subprocess.Popen[str]:
    """source_driver.py in a session of its own (so its Spark JVM dies with it)."""
    return subprocess.Popen(
        [sys.executable, str(DRIVER), ",".join(ackers.addresses), str(source), str(checkpoint), str(db), str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def acked_outcomes(checkpoint: Path) -> int:
    """ACKED outcomes the driver has journaled so far."""
    _, outcomes = Checkpoint(checkpoint).read_outcomes()
    return int((outcomes == int(Outcome.ACKED)).sum())


@pytest.mark.chaos
def test_driver_killed_mid_run_resumes_from_checkpoint(ackers: Any, tmp_path: Path) -> None:
    """kill -9 after some trees were acked: the second driver finishes, sink exact, no acked record redone."""
    lines = write_lines(tmp_path / "in", 600, files=4)
    db, checkpoint = tmp_path / "sink.sqlite", tmp_path / "checkpoint"
    create_sink(db)
    first = start_driver(ackers, tmp_path / "in", checkpoint, db, 1)
    try:
        deadline = time.monotonic() + RUN_CAP_SECONDS
        while acked_outcomes(checkpoint) < 50:
            assert first.poll() is None, (
                f"the first driver ended before it was killed: {first.communicate()[1][-3000:]}"
            )
            assert time.monotonic() < deadline, "no outcome journaled in time"
            time.sleep(0.1)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    run_one_rounds = json.loads((checkpoint / "manifest.json").read_text())["source"]["next_round"]
    assert not json.loads((checkpoint / "manifest.json").read_text())["source"]["source_done"], (
        "killed too late: round 0 done"
    )

    second = start_driver(ackers, tmp_path / "in", checkpoint, db, 2)
    try:
        out, err = second.communicate(timeout=RUN_CAP_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(second.pid, signal.SIGKILL)
        out, err = second.communicate()
        pytest.fail(f"the second driver did not finish; stderr tail:\n{err[-4000:]}")
    assert second.returncode == 0, err[-4000:]
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["resumed"] and stats["pending"] == 0 and stats["dead_lettered"] == 0
    assert stats["emitted"] == stats["acked"] == 600
    assert sink_counts(db) == expected_counts(line_records(lines))

    # Which records the ackers acked for the first driver: ACKED outcomes for roots it started.
    started = np.concatenate([read_round(checkpoint, r).roots for r in range(run_one_rounds)])
    roots, outcomes = Checkpoint(checkpoint).read_outcomes()
    acked_first = {f"{int(r):016X}" for r in roots[(outcomes == int(Outcome.ACKED)) & np.isin(roots, started)]}
    assert acked_first, "the kill came before any tree was acked: nothing to check"
    with open_db(db) as conn:
        writes = conn.execute("SELECT record_key, root, run FROM writes").fetchall()
    # hex() of the root's little-endian bytes: turn the big-endian hex of the journal around.
    acked_keys = {key for key, root, run in writes if run == 1 and _swap(root) in acked_first}
    redone = sorted({key for key, _, run in writes if run == 2} & acked_keys)
    assert not redone, f"{len(redone)} records acked under the first driver were processed again: {redone[:5]}"
    assert {key for key, _, _ in writes} >= acked_keys


def _swap(little_endian_hex: str) -> str:
    return bytes.fromhex(little_endian_hex)[::-1].hex().upper()
