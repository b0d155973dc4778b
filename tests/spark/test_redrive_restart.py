"""kill -9 of a driver mid-redrive, then a new driver finishes the redrive: each dead letter redriven in one
redrive, acked, and no delivery acked under the first driver processed again."""

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
from acker_protocol.wire import Outcome
from acker_spark import DeadLetterStore, close_clients
from acker_spark.sqlite import open_db
from acker_spark.tracking.checkpoint import Checkpoint
from acker_spark.tracking.emission_log import read_round

pytestmark = pytest.mark.spark

DRIVER = Path(__file__).with_name("redrive_driver.py")
RUN_CAP_SECONDS = 300  # a hang guard for one driver run (Spark start, the job), not a speed check
LETTERS = 400


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Ackers that outlive both drivers (the test process hosts them), with a timeout no job reaches."""
    with local_cluster(2, message_timeout=120.0) as cluster:
        yield cluster
    close_clients()


def start_driver(ackers: Any, store: Path, checkpoint: Path, db: Path, run: int) -> subprocess.Popen[str]:
    """redrive_driver.py in a session of its own (so its Spark JVM dies with it)."""
    return subprocess.Popen(
        [sys.executable, str(DRIVER), ",".join(ackers.addresses), str(store), str(checkpoint), str(db), str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def writes(db: Path) -> list[tuple[str, str, int]]:
    if not db.exists():
        return []
    with open_db(db) as conn:
        exists = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'writes'").fetchone()
        return conn.execute("SELECT id, root, run FROM writes").fetchall() if exists else []


@pytest.mark.chaos
def test_driver_killed_mid_redrive_is_finished_by_the_next_each_letter_once(ackers: Any, tmp_path: Path) -> None:
    store_path, checkpoint, db = tmp_path / "dead.sqlite", tmp_path / "cp", tmp_path / "sink.sqlite"
    store = DeadLetterStore(store_path)
    store.add_many(
        (f"k{i:04d}", {"id": f"k{i:04d}", "amount": float(i)}, Outcome.FAILED, 1, "ValueError: not a number")
        for i in range(LETTERS)
    )
    first = start_driver(ackers, store_path, checkpoint, db, 1)
    try:
        deadline = time.monotonic() + RUN_CAP_SECONDS
        while len(writes(db)) < 60:
            assert first.poll() is None, (
                f"the first driver ended before it was killed: {first.communicate()[1][-3000:]}"
            )
            assert time.monotonic() < deadline, "no write in time"
            time.sleep(0.1)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    (run,) = store.redrives()
    assert run.status == "running", "killed too late: the redrive finished"
    assert {d.redrive_status for d in store.all()} == {"redriving"}

    second = start_driver(ackers, store_path, checkpoint, db, 2)
    try:
        out, err = second.communicate(timeout=RUN_CAP_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(second.pid, signal.SIGKILL)
        out, err = second.communicate()
        pytest.fail(f"the second driver did not finish; stderr tail:\n{err[-4000:]}")
    assert second.returncode == 0, err[-4000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["resumed"] and report["redrive_id"] == run.redrive_id
    assert (report["claimed"], report["acked"], report["dead"]) == (LETTERS, LETTERS, 0)
    assert {d.redrive_status for d in store.all()} == {"acked"}
    assert [r.status for r in store.redrives()] == ["done"]  # one redrive: no letter taken by a second one

    # The deliveries the ackers acked for the first driver were not processed again by the second.
    chunk = checkpoint / "redrives" / run.redrive_id / "chunk-00000" / "checkpoint"
    manifest = json.loads((chunk / "manifest.json").read_text())
    started = np.concatenate([read_round(chunk, r).roots for r in range(manifest["source"]["next_round"])])
    roots, outcomes = Checkpoint(chunk).read_outcomes()
    acked = {f"{int(r):016X}" for r in roots[(outcomes == int(Outcome.ACKED)) & np.isin(roots, started)]}
    rows = writes(db)
    acked_first = {i for i, root, r in rows if r == 1 and _swap(root) in acked}
    assert acked_first, "the kill came before any tree was acked: nothing to check"
    redone = sorted({i for i, _, r in rows if r == 2} & acked_first)
    assert not redone, f"{len(redone)} letters acked under the first driver were processed again: {redone[:5]}"
    assert {i for i, _, _ in rows} == {d.key for d in store.all()}


def _swap(little_endian_hex: str) -> str:
    """hex() of the root's little-endian bytes, turned into the journal's big-endian hex."""
    return bytes.fromhex(little_endian_hex)[::-1].hex().upper()
