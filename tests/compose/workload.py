"""A spout/bolt workload driven from the host through the published ports, with replays and an audit.

Every record is emitted as a tree of three tuples (the spout tuple and two children
a bolt emits anchored to it); the bolt acks the spout tuple at once and the children
a little later, so trees are always in flight on every shard. A failed record
(FAILED, TIMED_OUT or LOST) is replayed as a new emit after a short pause until it
is acked. The audit checks the guarantees:

- exactly one callback per emit (an emit is a (record, attempt) pair);
- no false ack: an ACKED callback only for a tree whose last tuple the bolt had acked;
- nothing lost: every record ends acked.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field

from acker_client import AckerError, BoltCollector, ClusterClient, Spout
from acker_protocol.wire import Outcome

# How long the bolt holds the children before acking them (keeps trees pending).
HOLD_SECONDS = 0.2
# Pause before a failed record is emitted again.
REPLAY_PAUSE = 0.5


@dataclass
class Figures:
    """What a run did, for the test's assertions and the closing note."""

    records: int = 0
    trees: int = 0  # emits, first deliveries and replays
    acked: int = 0
    failed: dict[str, int] = field(default_factory=lambda: collections.Counter())
    replayed: int = 0
    false_acks: int = 0
    duplicate_callbacks: int = 0
    lost_records: int = 0  # records never acked in the end
    failed_on_shard: dict[int, int] = field(default_factory=lambda: collections.Counter())
    slowest_failure_seconds: float = 0.0

    def line(self, label: str) -> str:
        """One printable line of figures."""
        return (
            f"{label}: records={self.records} trees={self.trees} acked={self.acked} "
            f"failed={dict(self.failed)} by_shard={dict(self.failed_on_shard)} replayed={self.replayed} "
            f"lost={self.lost_records} false_acks={self.false_acks} duplicate_callbacks={self.duplicate_callbacks} "
            f"slowest_failure={self.slowest_failure_seconds:.1f}s"
        )


class Workload:
    """Drives records through a Spout and a BoltCollector on one thread until stopped, replaying failures."""

    def __init__(self, addresses: list[str], *, rate: float = 300.0, max_pending: int = 500) -> None:
        self.client = ClusterClient(addresses, deadline=2.0)
        self.spout = Spout(self.client, on_ack=self._on_ack, on_fail=self._on_fail, max_pending=max_pending)
        self.bolt = BoltCollector(self.client)
        self.rate = rate
        self._lock = threading.Lock()
        self._next_record = 0
        self._complete: set[tuple[int, int]] = set()  # emits whose last tuple the bolt acked
        self._callbacks: collections.Counter[tuple[int, int]] = collections.Counter()
        self._emitted: dict[tuple[int, int], tuple[int, float]] = {}  # emit -> (root, when)
        self._acked_records: set[int] = set()
        self._replays: collections.deque[tuple[float, int, int]] = collections.deque()  # (due, record, attempt)
        self._held: collections.deque[tuple[float, tuple[int, int], list]] = collections.deque()
        self.figures = Figures()
        self._stop_new = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="compose-workload", daemon=True)

    # -- callbacks (the spout's dispatch thread) ------------------------------

    def _on_ack(self, emit: tuple[int, int]) -> None:
        with self._lock:
            self._callbacks[emit] += 1
            self.figures.acked += 1
            if emit not in self._complete:
                self.figures.false_acks += 1
            self._acked_records.add(emit[0])

    def _on_fail(self, emit: tuple[int, int], reason: Outcome) -> None:
        with self._lock:
            self._callbacks[emit] += 1
            self.figures.failed[reason.name.lower()] += 1
            # An init refused inside emit() fails the record before emit() returned.
            root, when = self._emitted.get(emit, (-1, time.monotonic()))
            self.figures.failed_on_shard[root % self.client.shard_count if root >= 0 else -1] += 1
            self.figures.slowest_failure_seconds = max(self.figures.slowest_failure_seconds, time.monotonic() - when)
            self._replays.append((time.monotonic() + REPLAY_PAUSE, emit[0], emit[1] + 1))

    # -- the load thread ------------------------------------------------------

    def start(self) -> Workload:
        """Start the spout and the load thread."""
        self.spout.start()
        self._thread.start()
        return self

    def _loop(self) -> None:
        interval = 1.0 / self.rate
        while not self._stop.is_set():
            now = time.monotonic()
            self._ack_held(now)
            emit = self._next_emit(now)
            if emit is not None:
                self._emit(*emit)
            elif self._stop_new.is_set():
                time.sleep(0.01)
            time.sleep(interval)
        self._ack_held(float("inf"))
        self._flush()

    def _next_emit(self, now: float) -> tuple[int, int] | None:
        with self._lock:
            if self._replays and self._replays[0][0] <= now:
                _, record, attempt = self._replays.popleft()
                self.figures.replayed += 1
                return record, attempt
            if self._stop_new.is_set():
                return None
            record = self._next_record
            self._next_record += 1
            self.figures.records += 1
            return record, 1

    def _emit(self, record: int, attempt: int) -> None:
        emit = (record, attempt)
        spout_tuple = self.spout.emit(f"record {record}", emit)
        (root,) = spout_tuple.message_id.roots
        with self._lock:
            self._emitted.setdefault(emit, (root, time.monotonic()))
            self.figures.trees += 1
        children = [self.bolt.emit((record, part), anchors=[spout_tuple]) for part in range(2)]
        self._ack(spout_tuple)
        self._held.append((time.monotonic() + HOLD_SECONDS, emit, children))

    def _ack_held(self, now: float) -> None:
        while self._held and self._held[0][0] <= now:
            _, emit, children = self._held.popleft()
            with self._lock:
                # Marked before the last ack is sent: no acker can see it earlier.
                self._complete.add(emit)
            for child in children:
                self._ack(child)

    def _ack(self, tracked) -> None:
        try:
            self.bolt.ack(tracked)
        except AckerError:
            pass  # the batch went to an unreachable shard: the tree is left to the backstop

    def _flush(self) -> None:
        try:
            self.client.flush()
        except AckerError:
            pass

    # -- finishing ------------------------------------------------------------

    def finish(self, timeout: float) -> Figures:
        """Stop new records, keep replaying until every record is acked (or `timeout`), then audit."""
        self._stop_new.set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                done = len(self._acked_records) == self._next_record and not self._replays
            if done and self.spout.wait_idle(0.1):
                break
            time.sleep(0.1)
        self._stop.set()
        self._thread.join(30)
        self.spout.close()
        self.client.close()
        with self._lock:
            self.figures.duplicate_callbacks = sum(n - 1 for n in self._callbacks.values() if n > 1)
            missing = set(self._emitted) - set(self._callbacks)
            self.figures.lost_records = self._next_record - len(self._acked_records)
            assert not missing, f"{len(missing)} emits never got a callback, e.g. {sorted(missing)[:5]}"
        return self.figures

    def acked_since(self) -> int:
        """Acked callbacks so far (to see load recover)."""
        with self._lock:
            return self.figures.acked

    @property
    def backstop(self) -> float:
        """The spout's backstop timeout, seconds."""
        return self.spout.timeout
