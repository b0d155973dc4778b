"""ArrowBolt(time_limit=...): a record that hangs is interrupted, failed alone and replayed as a timeout (issue 28, item 5).

Reproduced before: one record hanging in a bolt held its whole task (and the
run) for as long as it hung. The limit is a SIGALRM timer around each call of
the function, which needs the call to run in the worker process's main
thread: the Spark test checks that it does.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_protocol.wire import Outcome
from acker_spark import ArrowBolt, DeadLetterStore, RecordTimeLimit, ReplayPolicy, close_clients
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.job_errors import job_error
from acker_spark.steps.time_limit import call_time_limit
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 64
HUNG = "k0037"


def stuck() -> None:
    time.sleep(30)  # interrupted by the limit long before


def test_the_limit_interrupts_a_hung_call_and_names_where_it_was_stuck():
    """A timeout, not poison; the cause points at the user's line, not at the timer's handler."""
    with pytest.raises(RecordTimeLimit, match=r"bolt 'b' ran past its time limit of 0.2 s") as caught:
        with call_time_limit(0.2, "bolt 'b'"):
            stuck()
    assert isinstance(caught.value, TimeoutError)
    cause = job_error(caught.value)
    assert cause.type == "RecordTimeLimit" and "in stuck" in cause.where, cause


def test_a_timer_armed_outside_keeps_its_deadline_and_handler():
    """pytest-timeout (or the user) may have armed SIGALRM: the limit re-arms it afterwards with what is left."""
    import signal

    fired: list[int] = []
    before = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 50.0)
        with call_time_limit(None, "b"):
            pass
        with call_time_limit(5.0, "b"):
            pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left <= 50.0, "the outer timer is armed again"
        with pytest.raises(RecordTimeLimit):
            with call_time_limit(0.2, "b"):
                stuck()
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= left
        assert fired == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def test_an_outer_timer_that_comes_first_still_fires_its_own_handler():
    import signal

    fired: list[int] = []
    before = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(RecordTimeLimit):
            with call_time_limit(0.4, "b"):
                stuck()
        assert fired == [signal.SIGALRM], "the outer handler ran at its deadline, then ours at its own"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def test_a_bad_time_limit_is_refused():
    with pytest.raises(ValueError, match="time_limit must be positive seconds or None"):
        ArrowBolt(lambda b, c: None, None, schema=None, time_limit=0)


@pytest.fixture
def ackers() -> Iterator[Any]:
    with local_cluster(2, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


class HangOn:
    """A sink whose record HUNG hangs (a minute, on every delivery); notes whether it ran in the main thread."""

    def __init__(self, note: Path) -> None:
        self.note = note

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        self.note.write_text(str(threading.current_thread() is threading.main_thread()))
        if HUNG in batch.column("id").to_pylist():
            time.sleep(60)


@pytest.mark.spark
def test_a_hung_record_is_failed_alone_and_replayed_until_dead_with_its_cause(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    note = tmp_path / "main-thread"
    rows = [(f"k{i:04d}", i) for i in range(RECORDS)]
    source = spark.createDataFrame(rows, "id string, n long").repartition(1)
    sink = ArrowBolt(HangOn(note), ackers.addresses, schema=None, name="slow", time_limit=0.5)
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    policy = ReplayPolicy(max_attempts=2, backoff_base=0.05, backoff_cap=0.2)
    pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=policy, dead_letters=letters, progress=None)
    stats = pipeline.run(source, lambda df: sink.apply_df(df).count(), key="id")
    assert note.read_text() == "True", "PySpark ran the function outside the worker's main thread"
    assert (stats.acked, stats.dead_lettered, stats.job_errors) == (RECORDS - 1, 1, 0)
    assert stats.replayed == 1, "a time limit is a timeout: retried, not dead-lettered at once"
    (letter,) = letters.all()
    assert (letter.key, letter.reason, letter.attempts) == (HUNG, Outcome.FAILED, 2)
    assert letter.cause is not None and letter.cause.startswith("RecordTimeLimit: bolt 'slow' ran past its time limit")
    assert "in __call__)" in letter.cause
