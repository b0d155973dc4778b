"""The driver's outcome feed: one subscription per shard, outcomes journaled to the checkpoint, handed over in bulk.

Outcomes arrive on the subscriptions' threads as numpy arrays and are only
appended to a list there. A journal thread writes what arrived to the
checkpoint's outcome journal every ``interval`` seconds (``fsync``), then
records the stream positions the journal is complete up to, and hands the
arrays to the driver thread (:meth:`OutcomeFeed.take`). A driver restarted
from the checkpoint resumes every stream after its recorded position, so an
outcome is either in the journal or still retained by its acker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from acker_client.subscription import OutcomeSubscription
from acker_protocol.wire import Outcome

from .checkpoint import Checkpoint

__all__ = ["OutcomeFeed"]

log = logging.getLogger(__name__)

_RESET = int(Outcome.TIMEOUT_RESET)
_ACKED = int(Outcome.ACKED)


class OutcomeFeed:
    """Subscribes ``spout`` on every shard of ``cluster``; journals and buffers its outcomes (no object per outcome)."""

    def __init__(self, cluster: Any, spout: str, checkpoint: Checkpoint, interval: float = 0.25) -> None:
        self.cluster = cluster
        self.spout = spout
        self.checkpoint = checkpoint
        self.interval = interval
        self.dropped = 0  # outcomes the ackers could not retain for us (reported by the streams)
        self._lock = threading.Lock()
        self._arrived: list[tuple[np.ndarray, np.ndarray]] = []
        self._ready: list[tuple[np.ndarray, np.ndarray]] = []
        self._journal_lock = threading.Lock()
        self._journal = checkpoint.outcome_journal()
        self._stop = threading.Event()
        self._wake = threading.Condition()
        self._subs: list[OutcomeSubscription] = []
        # Observers of outcomes as they arrive (the round watch), called on the subscriptions'
        # threads with each batch's roots and outcomes (lease renewals, TIMEOUT_RESET, included):
        # they must be quick and must not block.
        self.taps: list[Callable[[np.ndarray, np.ndarray], None]] = []
        self._saved: dict[int, tuple[int, int]] | None = None  # the positions last written
        self._thread = threading.Thread(target=self._loop, name="acker-outcome-journal", daemon=True)
        # Totals for the progress view (read from its thread): (acked, failed) that arrived, and that take() handed out.
        self._arrived_counts = (0, 0)
        self._taken_counts = (0, 0)

    def start(self) -> OutcomeFeed:
        """Open the streams (resuming after the checkpoint's positions) and start the journal thread."""
        positions = self.checkpoint.positions()
        for shard in range(self.cluster.shard_count):
            sub = OutcomeSubscription(
                self.cluster, shard, self.spout, deliver_batch=self._arrive, on_dropped=self._on_dropped
            )
            sub.incarnation, sub.last_sequence = positions.get(shard, (0, 0))
            self._subs.append(sub.start())
        self._thread.start()
        return self

    def stream_breaks(self) -> int:
        """How many times an outcome stream has broken since the feed started (an acker killed, restarted, cut off)."""
        return sum(sub.reconnects for sub in self._subs)

    def closed_streams(self) -> set[int]:
        """The shards whose outcome stream is not open now (never opened, or broken and reconnecting)."""
        return {sub.shard for sub in self._subs if not sub.connected}

    def _arrive(self, roots: np.ndarray, outcomes: np.ndarray, _micros: np.ndarray) -> None:
        # The taps see lease renewals too (a hung-round check tells a task alive from one cut off by them).
        for tap in list(self.taps):
            tap(roots, outcomes.astype(np.int8))
        keep = outcomes != _RESET  # a fresh timeout is news, not an end
        roots, ends = roots[keep], outcomes[keep].astype(np.int8)
        acked = int((ends == _ACKED).sum())
        with self._lock:
            self._arrived.append((roots, ends))
            done, failed = self._arrived_counts
            self._arrived_counts = (done + acked, failed + len(ends) - acked)
        with self._wake:
            self._wake.notify_all()

    def _on_dropped(self, count: int) -> None:
        with self._lock:
            self.dropped += count
        log.warning(
            "acker dropped %d outcomes of spout %s (retention overflow): their records will be replayed",
            count,
            self.spout,
        )

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def flush(self) -> None:
        """Journal what arrived (then the stream positions it covers) and make it available to :meth:`take`."""
        # Positions first: every batch they count was appended before its position moved.
        positions = {sub.shard: (sub.incarnation, sub.last_sequence) for sub in self._subs}
        with self._lock:
            arrived, self._arrived = self._arrived, []
        with self._journal_lock:
            if arrived:
                roots = np.concatenate([r for r, _ in arrived])
                outcomes = np.concatenate([o for _, o in arrived])
                self._journal.append(roots, outcomes)
                with self._lock:
                    self._ready.append((roots, outcomes))
            if positions != self._saved:  # an idle stream costs no write
                self.checkpoint.save_positions(positions)
                self._saved = positions

    def record(self, roots: np.ndarray, outcome: Outcome) -> None:
        """Journal the driver's own verdicts (LOST, a failed job's trees) before it acts on them."""
        with self._journal_lock:
            self._journal.append(roots, np.full(len(roots), int(outcome), dtype=np.int8))

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """Every journaled outcome not taken yet, oldest first (journals what just arrived first)."""
        self.flush()
        with self._lock:
            ready, self._ready = self._ready, []
            for _, outcomes in ready:
                acked = int((outcomes == _ACKED).sum())
                self._taken_counts = (self._taken_counts[0] + acked, self._taken_counts[1] + len(outcomes) - acked)
        if not ready:
            return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int8)
        return np.concatenate([r for r, _ in ready]), np.concatenate([o for _, o in ready])

    def counts(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """``((acked, failed) arrived, (acked, failed) taken)``: totals since the feed started (any thread)."""
        with self._lock:
            return self._arrived_counts, self._taken_counts

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when outcomes arrive."""
        with self._wake:
            self._wake.wait(timeout)

    def close(self) -> None:
        """Stop the streams and the journal thread, journal what arrived, close the journal."""
        self._stop.set()
        for sub in self._subs:
            sub.close()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self.flush()
        with self._journal_lock:
            self._journal.close()
