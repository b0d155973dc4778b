"""Driver side: which acker shards have been unreachable, since when and why, for progress lines and a bound.

A :class:`ShardWatch` listens to the driver's ``ClusterClient`` errors
(``add_error_listener``): a shard whose batch could not be delivered is
marked down from that moment. :meth:`ShardWatch.check` asks a marked shard
for its Describe (no wait for a connection, so the answer is the real cause,
e.g. "Connection refused", not a deadline) at most once per ``probe_interval``;
a shard that answers is up again. A shard down longer than ``bound`` seconds
is returned, so the pipeline can stop the run naming it instead of waiting
silently on trees it will never settle.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from acker_client import AckerError, ClusterClient, ShardUnavailable

from .run_report import DownShard, ShardDown

__all__ = ["ShardDown", "ShardWatch", "DownShard", "ProgressLine"]


class ShardWatch:
    """Shards of ``cluster`` seen unreachable: marked by the client's error listener, cleared by a Describe probe."""

    def __init__(self, cluster: ClusterClient, clock: Callable[[], float], probe_interval: float = 1.0) -> None:
        self.cluster = cluster
        self.clock = clock
        self.probe_interval = probe_interval
        self._down: dict[int, DownShard] = {}
        self._probed = 0.0
        self._lock = threading.Lock()

    def __call__(self, error: AckerError) -> None:
        """The client's error listener: mark every shard a dropped batch could not reach."""
        if not isinstance(error, ShardUnavailable):
            return
        now = self.clock()
        with self._lock:
            for failure in error.failures:
                # A shard already marked keeps its probe's cause: a batch's own reads DEADLINE_EXCEEDED.
                if failure.shard not in self._down:
                    self._down[failure.shard] = DownShard(failure.shard, failure.address, now, failure.describe())

    def down(self) -> list[DownShard]:
        """The shards marked down now, by index."""
        with self._lock:
            return [self._down[i] for i in sorted(self._down)]

    def check(self, force: bool = False) -> list[DownShard]:
        """Probe the marked shards (at most once per ``probe_interval``, unless ``force``); those still down."""
        now = self.clock()
        if not self._down or (now - self._probed < self.probe_interval and not force):
            return self.down()
        self._probed = now
        for shard in self.down():
            try:
                self.cluster.describe(shard.shard)
            except ShardUnavailable as err:
                cause = "; ".join(f.describe() for f in err.failures)
                with self._lock:
                    self._down[shard.shard] = DownShard(shard.shard, shard.address, shard.since, cause)
            except AckerError:
                self._up(shard.shard)  # it answered, with a refusal: reachable
            else:
                self._up(shard.shard)
        return self.down()

    def down_longer_than(self, bound: float) -> tuple[DownShard, float] | None:
        """A shard unreachable for more than ``bound`` seconds, probed again now, and for how long; else None.

        The second probe makes the cause what a connection attempt says this
        moment, and clears a shard that answers again.
        """
        now = self.clock()
        if not any(now - shard.since > bound for shard in self.check()):
            return None
        for shard in self.check(force=True):
            if now - shard.since > bound:
                return shard, now - shard.since
        return None

    def _up(self, shard: int) -> None:
        with self._lock:
            self._down.pop(shard, None)


class ProgressLine:
    """While a driver waits: one INFO line per ``interval`` seconds with its counts and the shards it waits on.

    The first :meth:`tick` only starts the interval, so a run that waits
    briefly logs nothing. ``stats()`` (any object with ``acked``,
    ``dead_lettered``, ``pending`` and ``awaiting_replay``) is called only
    when a line is due.
    """

    def __init__(self, logger: logging.Logger, watch: ShardWatch, interval: float, clock: Callable[[], float]) -> None:
        self.logger = logger
        self.watch = watch
        self.interval = interval
        self.clock = clock
        self._logged_at: float | None = None

    def tick(self, stats: Callable[[], Any]) -> None:
        """Log the progress line if ``interval`` seconds passed since the last one (or since the first tick)."""
        now = self.clock()
        if self._logged_at is None:
            self._logged_at = now
            return
        if now - self._logged_at < self.interval:
            return
        self._logged_at = now
        counts = stats()
        waiting = "; ".join(
            f"waiting on shard {d.shard} at {d.address}, unreachable for {now - d.since:.0f} s: {d.cause}"
            for d in self.watch.down()
        )
        self.logger.info(
            "progress: %d acked, %d dead-lettered, %d pending, %d awaiting replay%s",
            counts.acked,
            counts.dead_lettered,
            counts.pending,
            counts.awaiting_replay,
            f"; {waiting}" if waiting else "",
        )
