"""A steady spout/bolt workload for the blip tests, and its audit: what completed, what was acked, replayed, lost.

The spout emits records at a fixed rate; bolt threads take each spout tuple,
emit ``children`` tuples anchored to it, ack the children, then ack the
parent. A tree's *work completed* the moment the bolt made its last ack call
(whether or not the client could deliver it). The audit then checks the
invariants the blip suite asserts: exactly one callback per emit, no ACKED
tree whose work had not completed (a false ack), and counts the completed
trees that were nevertheless reported LOST / TIMED_OUT (replayed work).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from acker_client import AckerError, BoltCollector, Spout, SpoutFull
from acker_protocol.wire import Outcome

__all__ = ["Workload", "WorkloadConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkloadConfig:
    """Emission rate (records/s), children per tree, bolt threads, and the spout's max_pending."""

    rate: float = 500.0
    children: int = 2
    bolt_threads: int = 2
    max_pending: int = 5000
    emit_timeout: float = 1.0
    # Seconds between a record's emit and the bolts' work on it: how long each tree stays in flight,
    # so that an acker killed under load holds trees (0: the bolts take each tuple at once).
    hold: float = 0.0


class Workload:
    """Runs a spout on ``spout_cluster`` and bolts on ``bolt_cluster`` (two ClusterClients) until stopped."""

    def __init__(self, spout_cluster, bolt_cluster, config: WorkloadConfig = WorkloadConfig(), **spout_kwargs) -> None:
        self.config = config
        self.spout_cluster = spout_cluster
        self.bolt_cluster = bolt_cluster
        self._lock = threading.Lock()
        self.callbacks: Counter = Counter()  # message id -> callbacks
        self.outcomes: dict[int, str] = {}  # message id -> first outcome ("acked", "failed", "timed_out" or "lost")
        self.completed: set[int] = set()
        self.emitted = 0
        self.emit_stalls = 0  # SpoutFull after emit_timeout: back-pressure reached the emitter
        self.bolt_errors: Counter = Counter()  # AckerError class name -> count
        self.spout = Spout(
            spout_cluster, on_ack=self._on_ack, on_fail=self._on_fail, max_pending=config.max_pending, **spout_kwargs
        )
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._emitting = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- callbacks -------------------------------------------------------------

    def _on_ack(self, message_id: int) -> None:
        with self._lock:
            self.callbacks[message_id] += 1
            self.outcomes.setdefault(message_id, "acked")

    def _on_fail(self, message_id: int, reason: Outcome) -> None:
        with self._lock:
            self.callbacks[message_id] += 1
            self.outcomes.setdefault(message_id, reason.name.lower())

    # -- running ---------------------------------------------------------------

    def start(self) -> Workload:
        """Start the spout, the emitter and the bolt threads."""
        self.spout.start()
        self._emitting.set()
        self._threads.append(threading.Thread(target=self._emit_loop, name="blip-emitter", daemon=True))
        for i in range(self.config.bolt_threads):
            self._threads.append(threading.Thread(target=self._bolt_loop, name=f"blip-bolt-{i}", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, drain_timeout: float) -> bool:
        """Stop emitting, let the bolts finish, wait for every callback; True if the spout drained in time."""
        self._emitting.clear()
        self._threads[0].join()
        for _ in range(self.config.bolt_threads):
            self._work.put(None)
        for thread in self._threads[1:]:
            thread.join()
        try:
            self.bolt_cluster.flush()
        except AckerError as exc:
            self.bolt_errors[type(exc).__name__] += 1
        drained = self.spout.wait_idle(drain_timeout)
        self.spout.close()
        return drained

    def _emit_loop(self) -> None:
        interval = 1.0 / self.config.rate
        next_at = time.monotonic()
        message_id = 0
        while self._emitting.is_set():
            now = time.monotonic()
            if now < next_at:
                time.sleep(next_at - now)
            next_at += interval
            try:
                tup = self.spout.emit(f"record-{message_id}", message_id, timeout=self.config.emit_timeout)
            except SpoutFull:
                self.emit_stalls += 1
                next_at = time.monotonic()
                continue
            with self._lock:
                self.emitted += 1
            self._work.put((message_id, tup, time.monotonic() + self.config.hold))
            message_id += 1

    def _bolt_loop(self) -> None:
        collector = BoltCollector(self.bolt_cluster)
        while True:
            item = self._work.get()
            if item is None:
                return
            message_id, tup, due = item
            wait = due - time.monotonic()
            if wait > 0:  # the queue is in emit order, so in due order
                time.sleep(wait)
            children = [collector.emit(("child", i), anchors=[tup]) for i in range(self.config.children)]
            for t in [*children, tup]:
                if t is tup:
                    with self._lock:
                        # The tree's last ack call: its work is done from here on,
                        # whether or not the client manages to deliver the ack.
                        self.completed.add(message_id)
                try:
                    collector.ack(t)
                except AckerError as exc:
                    self.bolt_errors[type(exc).__name__] += 1

    # -- audit -------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """The figures of the run (see the module docstring)."""
        with self._lock:
            outcomes = Counter(self.outcomes.values())
            not_once = sum(1 for m in range(self.emitted) if self.callbacks.get(m, 0) != 1)
            false_acks = sum(1 for m, o in self.outcomes.items() if o == "acked" and m not in self.completed)
            completed_replayed = Counter(o for m, o in self.outcomes.items() if o != "acked" and m in self.completed)
            stats = self.spout.stats
            client = self.spout_cluster.stats
            bolt = self.bolt_cluster.stats
            return {
                "emitted": self.emitted,
                "completed": len(self.completed),
                "acked": outcomes.get("acked", 0),
                "failed": outcomes.get(Outcome.FAILED.name.lower(), 0),
                "timed_out": outcomes.get(Outcome.TIMED_OUT.name.lower(), 0),
                "lost": outcomes.get(Outcome.LOST.name.lower(), 0),
                "replayed": self.emitted - outcomes.get("acked", 0),
                "completed_but_replayed": sum(completed_replayed.values()),
                "completed_but_lost": completed_replayed.get(Outcome.LOST.name.lower(), 0),
                "emits_without_exactly_one_callback": not_once,
                "false_acks": false_acks,
                "late_outcomes": stats.late_outcomes,
                "duplicate_outcomes": stats.duplicate_outcomes,
                "emit_stalls": self.emit_stalls,
                "bolt_errors": dict(self.bolt_errors),
                "spout_client_dropped": client.operations_dropped,
                "bolt_client_dropped": bolt.operations_dropped,
                "spout_client": _public(client),
                "bolt_client": _public(bolt),
            }


def _public(stats: Any) -> dict[str, Any]:
    """A stats dataclass as a JSON-friendly dict."""
    out = {}
    for name, value in vars(stats).items():
        if isinstance(value, int | float | str):
            out[name] = value
        elif isinstance(value, dict):
            out[name] = {str(k): v for k, v in value.items()}
        elif isinstance(value, list | tuple):
            out[name] = [str(v) for v in value]
    return out
