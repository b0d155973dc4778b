"""Driver side: which acker shards have been unreachable, since when and why, for progress lines and a bound.

A :class:`ShardWatch` listens to the driver's ``ClusterClient`` errors
(``add_error_listener``): a shard whose batch could not be delivered is
marked down from that moment. :meth:`ShardWatch.check` asks a marked shard
for its Describe (no wait for a connection, so the answer is the real cause,
e.g. "Connection refused", not a deadline) at most once per ``probe_interval``;
a shard that answers is up again. A shard down longer than ``bound`` seconds
is returned, so the pipeline can stop the run naming it instead of waiting
silently on trees it will never settle.

The driver itself sends little (the executors init and ack), so its client
may never fail a batch on a dead shard. The driver's outcome streams are the
other witness: given ``silent`` (the shards whose outcome stream is not open
now), a shard whose stream stayed closed for ``probe_interval`` is probed too,
and marked down from when its stream was first seen closed if it does not
answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from acker_client import AckerError, ClusterClient, ShardUnavailable

from ..run_report import DownShard, ShardDown

__all__ = ["ShardDown", "ShardWatch", "DownShard", "DownTooLong"]


@dataclass(frozen=True)
class DownTooLong:
    """A round watch's verdict: ``shard`` has been unreachable for ``seconds``, past the pipeline's bound."""

    shard: DownShard
    seconds: float

    def __str__(self) -> str:
        return f"acker shard {self.shard.shard} at {self.shard.address} unreachable for {self.seconds:.0f} s"


class ShardWatch:
    """Shards of ``cluster`` seen unreachable: marked by the client's error listener, cleared by a Describe probe."""

    def __init__(
        self,
        cluster: ClusterClient,
        clock: Callable[[], float],
        probe_interval: float = 1.0,
        silent: Callable[[], set[int]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.clock = clock
        self.probe_interval = probe_interval
        # The shards whose outcome stream is closed now (set by the pipeline once its feed runs).
        self.silent = silent
        self._down: dict[int, DownShard] = {}
        self._silent_since: dict[int, float] = {}
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
        quiet = self._long_silent(now)
        if (not self._down and not quiet) or (now - self._probed < self.probe_interval and not force):
            return self.down()
        self._probed = now
        suspects = [(d.shard, d.address, d.since) for d in self.down()]
        suspects += [(shard, self.cluster.addresses[shard], since) for shard, since in quiet]
        for shard, address, since in suspects:
            try:
                self.cluster.describe(shard)
            except ShardUnavailable as err:
                cause = "; ".join(f.describe() for f in err.failures)
                with self._lock:
                    self._down[shard] = DownShard(shard, address, since, cause)
            except AckerError:
                self._up(shard)  # it answered, with a refusal: reachable
            else:
                self._up(shard)
        return self.down()

    def _long_silent(self, now: float) -> list[tuple[int, float]]:
        """Shards not marked down whose outcome stream has been closed for ``probe_interval``, with since when."""
        if self.silent is None:
            return []
        closed = self.silent()
        for shard in closed:
            self._silent_since.setdefault(shard, now)
        for shard in set(self._silent_since) - closed:
            del self._silent_since[shard]
        return [
            (shard, since)
            for shard, since in sorted(self._silent_since.items())
            if shard not in self._down and now - since >= self.probe_interval
        ]

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

    def check_bound(self, bound: float) -> DownTooLong | None:
        """A round watch's check: the verdict if a shard has been unreachable for more than ``bound`` seconds."""
        down = self.down_longer_than(bound)
        return DownTooLong(*down) if down is not None else None

    def _up(self, shard: int) -> None:
        with self._lock:
            self._down.pop(shard, None)


def __getattr__(name: str) -> Any:
    """``ProgressLine`` moved to :mod:`acker_spark.progress.driver_progress`: the old import warns and still works."""
    if name == "ProgressLine":
        import warnings

        from ..progress.driver_progress import ProgressLine

        warnings.warn(
            "acker_spark.shard_watch.ProgressLine moved to acker_spark.progress.driver_progress.ProgressLine",
            DeprecationWarning,
            stacklevel=2,
        )
        return ProgressLine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
