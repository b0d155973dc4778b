"""acker-bench's outcome reader: one spout's outcome streams, read as numpy arrays and timed per batch.

The columnar load generator's stand-in for a spout: it subscribes to every
shard, resumes after a broken stream from the last sequence it processed,
and turns each OutcomeBatch into arrays, counting ACKED and failed trees and
timing each acked tree against its batch's last-ack time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc
import numpy as np
from acker_protocol.wire import Outcome

from .columns_load import CHUNKS

__all__ = ["OutcomeReader"]

log = logging.getLogger(__name__)

_ACKED = int(Outcome.ACKED)
_FAILED = (int(Outcome.FAILED), int(Outcome.TIMED_OUT))


class OutcomeReader:
    """Counts and times the outcomes of ``spout`` on every shard of ``client``, in background threads.

    ``chunk_of(roots)`` gives each root's batch number; ``sent_at[batch]`` is
    set by the load generator before the batch's last ack call, so an acked
    tree's latency is its outcome's arrival minus that moment.
    """

    def __init__(self, client, spout: str, chunk_of: Callable[[np.ndarray], np.ndarray]) -> None:
        self.client = client
        self.spout = spout
        self.chunk_of = chunk_of
        self.sent_at = np.zeros(CHUNKS, dtype=np.float64)
        self.acked = 0
        self.failed = 0
        self.duplicates = 0
        self._latencies: list[np.ndarray] = []
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._calls: dict[int, object] = {}
        self._threads = [
            threading.Thread(target=self._run, args=(shard,), name=f"bench-outcomes-{shard}", daemon=True)
            for shard in range(client.shard_count)
        ]

    @property
    def ended(self) -> int:
        """Trees whose outcome arrived."""
        return self.acked + self.failed

    def start(self) -> OutcomeReader:
        """Subscribe to every shard."""
        for thread in self._threads:
            thread.start()
        return self

    def wait_for_outcomes(self, timeout: float) -> None:
        """Block until the next outcome batch arrives, or ``timeout`` seconds."""
        with self._cond:
            self._cond.wait(timeout)

    def wait_for(self, trees: int, timeout: float) -> bool:
        """Wait until ``trees`` outcomes arrived; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.ended >= trees, timeout)

    def latencies(self) -> np.ndarray:
        """Seconds from each acked tree's last ack call to its outcome's arrival."""
        with self._cond:
            return np.concatenate(self._latencies) if self._latencies else np.zeros(0)

    def close(self) -> None:
        """Cancel the streams and stop the threads."""
        self._closing.set()
        with self._cond:
            calls = list(self._calls.values())
        for call in calls:
            call.cancel()  # type: ignore[attr-defined]
        for thread in self._threads:
            thread.join(5.0)

    def _run(self, shard: int) -> None:
        incarnation = last = 0
        while not self._closing.is_set():
            try:
                call = self.client.subscribe(shard, self.spout, incarnation, last)
                with self._cond:
                    self._calls[shard] = call
                if self._closing.is_set():
                    call.cancel()
                for batch in call:
                    if batch.incarnation != incarnation:
                        incarnation, last = batch.incarnation, 0
                    last = self.handle(batch.first_sequence, batch.root_ids, batch.outcomes, last)
            except grpc.RpcError as exc:
                if not self._closing.is_set():
                    log.warning("outcome stream of shard %d broke (%s); resuming", shard, exc.code())
                    self._closing.wait(0.05)

    def handle(self, first_sequence: int, root_ids, outcomes, last: int) -> int:
        """Count and time one batch of outcomes (skipping sequences up to ``last``); return the new last."""
        now = time.perf_counter()
        count = len(root_ids)
        skip = min(max(last - first_sequence + 1, 0), count)
        roots = np.array(root_ids, dtype=np.uint64)[skip:]
        kinds = np.array(outcomes, dtype=np.int64)[skip:]
        acked = roots[kinds == _ACKED]
        failed = int(np.isin(kinds, _FAILED).sum())
        latency = now - self.sent_at[self.chunk_of(acked)]
        with self._cond:
            self.duplicates += skip
            self.acked += int(acked.size)
            self.failed += failed
            self._latencies.append(latency)
            self._cond.notify_all()
        return max(last, first_sequence + count - 1)
