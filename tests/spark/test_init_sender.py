"""The reading task's inits off its read path: the task reads on while they are held back, yet ends only once they are applied.

No Spark: :meth:`SourceReader.run` is the task's body, run here over Arrow
batches against real ackers, with the client's delivery held back by a gate
the test opens.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from acker_client import ClusterClient, ShardUnavailable
from acker_client.testing import local_cluster, unreachable_addresses
from acker_spark import close_clients
from acker_spark.executor_read.source_reader import SourceReader
from acker_spark.steps import step
from acker_spark.steps.frames import decode_ids
from acker_spark.tracking.emission_log import RoundFilter, read_round, write_filter
from acker_spark.tracking.identity import IdentitySpec
from acker_spark.tracking.init_sender import InitSender

U64 = np.uint64
GUARD = 30.0  # seconds before a hung step fails the test instead of hanging it; never reached when it passes


class GatedClient:
    """A real cluster client whose ``init_columns`` waits for the test's gate, then delivers; counts what it applied."""

    def __init__(self, client: ClusterClient) -> None:
        self.client = client
        self.gate = threading.Event()
        self.entered = threading.Event()  # an init_columns call is waiting at the gate
        self.delivered = 0  # inits handed to the real client and flushed

    def init_columns(self, roots: np.ndarray, values: np.ndarray, spout: str) -> None:
        self.entered.set()
        if not self.gate.wait(GUARD):
            raise AssertionError("the test never opened the gate")
        self.client.init_columns(roots, values, spout)
        self.client.flush()
        self.delivered += len(roots)

    def flush(self) -> None:
        self.client.flush()


def _reader(tmp_path: Path, addresses: list[str], **client_options: Any) -> SourceReader:
    path = write_filter(tmp_path, 0, RoundFilter("all", np.zeros(0, U64), np.zeros(0, np.uint16)))
    return SourceReader(
        IdentitySpec("key", "k"), 99, "init-test", str(tmp_path), 0, str(path), addresses, client_options=client_options
    )


def _batches(count: int, rows: int) -> list[pa.RecordBatch]:
    return [pa.record_batch({"k": [f"{b}-{i}" for i in range(rows)], "v": list(range(rows))}) for b in range(count)]


def test_the_task_reads_on_while_its_inits_are_held_back_and_ends_only_once_they_are_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every batch is yielded, logged first, with no init delivered; the task's end waits for the gate."""
    with local_cluster(1, message_timeout=600.0) as ackers, ClusterClient(ackers.addresses) as client:
        gated = GatedClient(client)
        monkeypatch.setattr(step, "client_for", lambda *args, **kwargs: gated)
        batches = _batches(3, 100)
        task = _reader(tmp_path, ackers.addresses).run(iter(batches), partition=0, task_attempt=1)
        out: list[pa.RecordBatch] = []
        yielded, ended = threading.Event(), threading.Event()

        def run_task() -> None:
            for batch in task:
                out.append(batch)
                if len(out) == len(batches):
                    yielded.set()
            ended.set()

        runner = threading.Thread(target=run_task, daemon=True)
        runner.start()
        try:
            # Synchronous inits would hold the task at its first batch, before the gate.
            assert yielded.wait(GUARD), "the task stopped reading while its inits were held back"
            assert gated.entered.wait(GUARD) and gated.delivered == 0
            # Logged before any init went out: every root of the three batches is in the emission log.
            logged = read_round(tmp_path, 0).roots
            started = np.concatenate([decode_ids(b.column("_acker_ids")).roots for b in out])
            assert sorted(logged.tolist()) == sorted(started.tolist()) and len(logged) == 300
            runner.join(0.5)  # a task that did not wait for its inits would end here
            assert not ended.is_set(), "the task ended before its inits were delivered"
            assert client.describe(0).pending_trees == 0
        finally:
            gated.gate.set()
        runner.join(GUARD)
        assert ended.is_set() and gated.delivered == 300
        assert client.describe(0).pending_trees == 300


def test_a_delivery_failure_still_fails_the_task(tmp_path: Path) -> None:
    """An acker that cannot be reached: the task's batches are read and logged, and the task raises ShardUnavailable."""
    [address] = unreachable_addresses(1)
    reader = _reader(tmp_path, [address], wait_for_shard=0.0, deadline=0.2)
    try:
        with pytest.raises(ShardUnavailable):
            for _ in reader.run(iter(_batches(2, 50)), partition=0, task_attempt=1):
                pass
    finally:
        close_clients()
    assert len(read_round(tmp_path, 0).roots) == 100  # logged before the inits failed


class FailingClient:
    """Refuses every init (a shard that cannot be reached), counting the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def init_columns(self, roots: np.ndarray, values: np.ndarray, spout: str) -> None:
        self.calls += 1
        raise ShardUnavailable([], "shard 0 could not be reached")

    def flush(self) -> None:
        pass


def test_a_failed_batch_stops_the_sender_and_the_next_hand_off_raises() -> None:
    """After one failure nothing more is sent; the task hears of it on its next batch, or at the flush."""
    client = FailingClient()
    sender = InitSender(client, depth=1)
    ids = np.arange(1, 4, dtype=U64)
    sender.init_columns(ids, ids, "s")
    thread = sender._thread
    assert thread is not None
    with pytest.raises(ShardUnavailable):
        for _ in _forever():  # the hand-off raises once the thread has failed
            sender.init_columns(ids, ids, "s")
    with pytest.raises(ShardUnavailable):
        sender.flush()
    assert not thread.is_alive() and client.calls == 1


def _forever() -> Iterator[None]:
    while True:
        yield None


def test_close_drops_what_was_not_sent_without_waiting_for_the_batch_in_flight() -> None:
    """A failing task's close returns while a batch is still on its way; the batches behind it are dropped."""
    with local_cluster(1, message_timeout=600.0) as ackers, ClusterClient(ackers.addresses) as client:
        gated = GatedClient(client)
        sender = InitSender(gated, depth=1)
        first, second = np.arange(1, 11, dtype=U64), np.arange(11, 21, dtype=U64)
        sender.init_columns(first, first, "s")
        assert gated.entered.wait(GUARD)  # the thread holds the first batch, at the gate
        sender.init_columns(second, second, "s")  # waits in the queue
        thread = sender._thread
        assert thread is not None
        sender.close()  # returns with the first batch still at the gate
        gated.gate.set()
        thread.join(GUARD)
        assert not thread.is_alive() and gated.delivered == 10
        assert client.describe(0).pending_trees == 10


def test_depth_must_be_positive() -> None:
    """A sender with no room for a batch is refused with a clear message."""
    with pytest.raises(ValueError, match="depth must be at least 1"):
        InitSender(FailingClient(), depth=0)


def test_a_large_batch_is_logged_in_slices_as_it_is_read(tmp_path: Path) -> None:
    """Progress counts what readers have logged: a 5,000-row Arrow batch is logged 2,000 rows at a time, each slice
    before it is yielded, so the count moves while the task reads instead of jumping by a whole batch."""
    with local_cluster(1, message_timeout=600.0) as ackers:
        task = _reader(tmp_path, ackers.addresses).run(iter(_batches(1, 5_000)), partition=0, task_attempt=1)
        logged = []
        sizes = []
        for out in task:
            sizes.append(out.num_rows)
            logged.append(len(read_round(tmp_path, 0).roots))
        assert sizes == [2_000, 2_000, 1_000]
        assert logged == [2_000, 4_000, 5_000]
    close_clients()
