"""Fakes for unit tests that need no server: a cluster that records calls and an XOR ledger model."""

from __future__ import annotations

import queue
import threading
from collections import defaultdict

from acker_protocol.packed import decode_outcome_batch
from acker_protocol.v1 import acker_pb2


class RecordingCluster:
    """Records init/ack/fail/reset_timeout calls and models each tree's checksum like the acker."""

    def __init__(self, shard_count: int = 1, message_timeout: float = 10.0, buckets: int = 3) -> None:
        self.shard_count = shard_count
        self.message_timeout = message_timeout
        self.buckets = buckets
        self.calls: list[tuple] = []
        self.vals: dict[int, int] = defaultdict(int)
        self.failed: set[int] = set()
        self.flushes = 0
        self.listeners = []
        self.init_error: Exception | None = None
        self.streams: dict[int, queue.Queue] = defaultdict(queue.Queue)
        self.subscribes: list[tuple] = []
        self._closed = threading.Event()

    def init(self, root, value, spout):
        self.calls.append(("init", root, value, spout))
        self.vals[root] ^= value
        if self.init_error is not None:
            raise self.init_error

    def init_columns(self, roots, values, spout):
        self.calls.append(("init_columns", [int(r) for r in roots], [int(v) for v in values], spout))
        for root, value in zip(roots.tolist(), values.tolist()):
            self.vals[root] ^= value
        if self.init_error is not None:
            raise self.init_error

    def ack(self, root, value, dedup_key=0):
        self.calls.append(("ack", root, value, dedup_key))
        self.vals[root] ^= value

    def fail(self, root, dedup_key=0):
        self.calls.append(("fail", root))
        self.failed.add(root)

    def reset_timeout(self, root):
        self.calls.append(("reset_timeout", root))

    def flush(self):
        self.flushes += 1

    def complete(self, root) -> bool:
        """True if the modelled tree's checksum is 0 (every edge acked)."""
        return self.vals[root] == 0

    def describe(self, shard):
        return acker_pb2.DescribeResponse(
            shard_index=shard,
            shard_count=self.shard_count,
            message_timeout_seconds=self.message_timeout,
            buckets=self.buckets,
        )

    def subscribe(self, shard, spout, incarnation=0, after_sequence=0, timeout=None):
        self.subscribes.append((shard, spout, incarnation, after_sequence))
        return _QueueStream(self.streams[shard], self._closed)

    def push(self, shard: int, incarnation: int, first_sequence: int, roots, outcomes) -> None:
        """Make the shard's open (or next) outcome stream deliver one batch, decoded as the client's stream does."""
        message = acker_pb2.OutcomeBatch(
            incarnation=incarnation,
            first_sequence=first_sequence,
            root_ids=roots,
            outcomes=outcomes,
            latency_micros=[1] * len(roots),
        )
        self.streams[shard].put(decode_outcome_batch(message.SerializeToString()))

    def add_error_listener(self, listener):
        self.listeners.append(listener)

    def remove_error_listener(self, listener):
        self.listeners.remove(listener)

    def close(self):
        self._closed.set()


class _QueueStream:
    """An outcome stream fed from a queue; ends when cancelled."""

    def __init__(self, batches: queue.Queue, closed: threading.Event) -> None:
        self._batches = batches
        self._done = threading.Event()
        self._closed = closed

    def __iter__(self):
        return self

    def __next__(self):
        while not (self._done.is_set() or self._closed.is_set()):
            try:
                return self._batches.get(timeout=0.02)
            except queue.Empty:
                continue
        raise StopIteration

    def cancel(self):
        self._done.set()
