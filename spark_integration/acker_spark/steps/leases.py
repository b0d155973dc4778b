"""Leases: a bolt's task keeps the trees it holds alive while its function runs (issue 21).

A task holds every tree whose tuples it has read until its commit sends the
acks: those trees cannot complete before the partition is done, and a
partition that takes longer than the ackers' message timeout would see them
time out and be replayed while the work is still going on. Pub/Sub's clients
extend a held message's lease automatically; here a :class:`LeaseKeeper`
thread sends ``reset_timeout`` for the held roots (one columnar call) every
``LEASE_FRACTION`` of the message timeout, so two renewals may be lost before
a tree expires. The acker streams each reset to the spout, whose backstop
restarts too.

A tree is extended for at most ``cap`` seconds (plus one interval) after the
keeper first saw it (the ackers' ``--max-tree-lifetime`` caps it on the server
side in any case), so a livelocked task cannot keep trees alive forever. The
keeper never reads a clock per tuple: roots held between two renewals form one
generation, stamped with the time of the first renewal that sends them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from acker_client.columns import distinct

__all__ = ["LEASE_FRACTION", "ClusterTimeouts", "LeaseKeeper", "check_seconds", "cluster_timeouts"]

log = logging.getLogger(__name__)

# Renew at a third of the timeout: a renewal may be lost or late twice before a held tree expires.
LEASE_FRACTION = 1 / 3

# Per process: what the cluster's Describe said, by address list, with when it was asked. A cluster that
# did not answer is asked again after _RETRY_DESCRIBE seconds, not by every task (each would wait for it).
_described: dict[tuple[str, ...], tuple[ClusterTimeouts | None, float]] = {}
_described_lock = threading.Lock()
_RETRY_DESCRIBE = 60.0


@dataclass(frozen=True)
class ClusterTimeouts:
    """The ackers' message timeout and their cap on a tree's whole life (None: no cap), in seconds."""

    message_timeout: float
    max_tree_lifetime: float | None


def cluster_timeouts(client: Any, clock: Callable[[], float] = time.monotonic) -> ClusterTimeouts | None:
    """What the first shard that answers Describe says, cached per process; None if none did."""
    key = tuple(client.addresses)
    with _described_lock:
        known = _described.get(key)
    if known is not None and (known[0] is not None or clock() - known[1] < _RETRY_DESCRIBE):
        return known[0]
    found = None
    for shard in range(client.shard_count):
        try:
            info = client.describe(shard)
        except Exception as exc:  # an unreachable shard: another may answer
            log.debug("leases: Describe of shard %d failed: %s", shard, exc)
            continue
        lifetime = float(info.max_tree_lifetime_seconds)  # 0: the acker runs without --max-tree-lifetime
        found = ClusterTimeouts(float(info.message_timeout_seconds), lifetime or None)
        break
    if found is None:
        log.warning(
            "no acker of %s answered Describe: tasks in this process run without leases for the next %.0f s",
            ",".join(key),
            _RETRY_DESCRIBE,
        )
    with _described_lock:
        _described[key] = (found, clock())
    return found


def check_seconds(what: str, seconds: float | None, *, optional: bool = True) -> None:
    """Raise ValueError unless ``seconds`` is positive (or None, when ``optional``)."""
    if seconds is None and optional:
        return
    if seconds is None or not seconds > 0:
        raise ValueError(f"{what} must be positive seconds{' or None' if optional else ''}, got {seconds}")


class LeaseKeeper:
    """Renews the timeout of the roots a task holds, every ``interval`` seconds, until :meth:`stop`.

    ``renew(roots)`` sends the resets (``ClusterClient.reset_timeout_columns``).
    ``cap`` (seconds, None: no cap) bounds how long a root is extended after
    it was first held. :meth:`start` runs the renewals on a daemon thread;
    tests call :meth:`renew_now` with their own clock instead.
    """

    def __init__(
        self,
        renew: Callable[[np.ndarray], None],
        interval: float,
        *,
        cap: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_seconds("the lease interval", interval, optional=False)
        check_seconds("the lease cap", cap)
        self._renew = renew
        self.interval = interval
        self.cap = cap
        self._clock = clock
        # Appended to by the task's thread and read up to their length by the keeper's: appends are atomic
        # and nothing is ever removed, so no lock is taken per tuple and no root can slip between the two.
        self._held: list[int] = []  # one tuple's roots at a time
        self._held_columns: list[np.ndarray] = []  # a batch's roots at a time
        self._seen = (0, 0)  # how much of both lists earlier renewals took
        self._generations: list[tuple[float, np.ndarray]] = []  # (first renewal that sent them, roots)
        self._sources: list[Callable[[], np.ndarray]] = []
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0  # rounds that sent resets
        self.renewed = 0  # resets sent, in all

    # -- the task's side -------------------------------------------------------

    def hold(self, root: int) -> None:
        """The task now holds the tree ``root`` (a tuple it read)."""
        self._held.append(root)

    def hold_column(self, roots: np.ndarray) -> None:
        """The task now holds these trees (a batch's roots, uint64)."""
        if roots.size:
            self._held_columns.append(roots)

    def add_source(self, new_roots: Callable[[], np.ndarray]) -> None:
        """Before each renewal, also hold what ``new_roots()`` returns (trees the task holds but has not received).

        The reader of a source pipeline's task starts trees ahead of the bolt
        (:class:`~acker_spark.task_roots.ReaderTrees`): the bolt holds them
        from the renewal after they were started, not from when it gets them.
        """
        self._sources.append(new_roots)

    def start(self) -> LeaseKeeper:
        """Renew on a daemon thread every ``interval`` seconds until :meth:`stop`."""
        self._thread = threading.Thread(target=self._loop, name="acker-bolt-leases", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (the task's function returned and its commit is done)."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- renewing --------------------------------------------------------------

    def renew_now(self) -> int:
        """One renewal round: reset every held root still under the cap; how many were sent."""
        for source in self._sources:
            try:
                self.hold_column(source())
            except Exception:  # noqa: BLE001 - an unreadable file costs these leases, not the task
                log.debug("leases: reading the task's started trees failed", exc_info=True)
        now = self._clock()
        ints, columns = len(self._held), len(self._held_columns)
        fresh = self._held_columns[self._seen[1] : columns]
        if ints > self._seen[0]:
            fresh.append(np.fromiter(self._held[self._seen[0] : ints], dtype=np.uint64, count=ints - self._seen[0]))
        self._seen = (ints, columns)
        if fresh:
            self._generations.append((now, distinct(np.concatenate(fresh))))
        if self.cap is not None:
            # Generations are in time order: drop the front ones held past the cap.
            self._generations = [(seen, roots) for seen, roots in self._generations if now - seen < self.cap]
        if not self._generations:
            return 0
        roots = distinct(np.concatenate([roots for _, roots in self._generations]))
        self._renew(roots)
        self.renewals += 1
        self.renewed += int(roots.size)
        return int(roots.size)

    def _loop(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                self.renew_now()
            except Exception:  # a failed renewal must not end the task: the next round tries again
                log.warning(
                    "leases: renewing the held trees failed; trying again in %.1f s", self.interval, exc_info=True
                )
