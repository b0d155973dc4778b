"""The spout's pending map: every tree in flight, per shard in backstop-deadline order, added and settled in bulk.

Not thread-safe: the :class:`~acker_client.spout.Spout` holds its lock around
every call. One table per shard maps ``root -> (deadline, message_id)``;
because every entry of a shard gets the same timeout on that shard's
monotonic clock, insertion order is deadline order, and the backstop only
looks at the front of each table. A plain dict keeps insertion order and is
about twice as fast as an ``OrderedDict`` to fill and empty; "move to the end"
(a timeout reset) is a pop and a re-insert.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from .columns import shard_slices
from .errors import ShardUnavailable

__all__ = ["PendingTrees", "ShardClock", "cluster_backstop", "default_backstop"]

log = logging.getLogger(__name__)


def default_backstop(
    message_timeout: float, buckets: int, *, timeout_mode: str = "fixed", max_tree_lifetime: float = 0.0
) -> float:
    """The spout's timeout: the latest an acker can expire a tree, plus a margin for delivery.

    With the acker's ``progress`` timeout mode every ack restarts a tree's timeout,
    and the spout sees no acks: only the acker's lifetime cap bounds the tree, so
    the backstop follows the cap instead of the message timeout.
    """
    period = message_timeout / max(buckets - 1, 1)
    # An acker expires a tree between T and T + T/(b-1) after its init (or its
    # last restart), and a capped tree within one period after the cap.
    if timeout_mode == "progress" and max_tree_lifetime > 0:
        latest = max_tree_lifetime + period
    else:
        latest = message_timeout + period
    return latest + max(1.0, 0.2 * message_timeout)


def cluster_backstop(cluster: Any) -> float:
    """The backstop for ``cluster``'s trees: :func:`default_backstop` of the slowest shard that answers Describe."""
    timeouts = _backstops(cluster, None)
    # A driver starting while the ackers it can reach restart (a killed acker coming back) waits for
    # them, up to the client's wait_for_shard in all, instead of failing the run at its first step.
    wait = float(getattr(cluster, "wait_for_shard", 0.0) or 0.0)
    if not timeouts and wait:
        timeouts = _backstops(cluster, wait / max(1, cluster.shard_count))
    if not timeouts:
        raise ShardUnavailable([], "no acker answered Describe; cannot choose the spout's backstop timeout")
    return max(timeouts)


class ShardClock:
    """A shard's backstop clock: the spout's clock minus the time the shard's outcome stream was down.

    While the stream is broken, outcomes the acker produces (ACKED, or the
    TIMED_OUT it decides during the outage) wait in its retention for the
    resume, so the backstop must not count that time against the trees. A
    single outage pauses the clock for at most ``max_pause`` seconds, so a
    stream that never comes back still ends in LOST callbacks.
    """

    __slots__ = ("paused", "down_since", "max_pause")

    def __init__(self, max_pause: float) -> None:
        self.paused = 0.0  # finished outages, each capped
        self.down_since: float | None = None
        self.max_pause = max_pause

    def now(self, clock_now: float) -> float:
        """This shard's backstop time at the spout's clock time ``clock_now``."""
        return clock_now - self.paused - self.current_pause(clock_now)

    def current_pause(self, clock_now: float) -> float:
        """Seconds the clock has stood still in the current outage (0 when the stream is up)."""
        if self.down_since is None:
            return 0.0
        return min(clock_now - self.down_since, self.max_pause)

    def set_down(self, down: bool, clock_now: float) -> None:
        """Start or end an outage."""
        if down and self.down_since is None:
            self.down_since = clock_now
        elif not down and self.down_since is not None:
            self.paused += self.current_pause(clock_now)
            self.down_since = None


class PendingTrees:
    """Roots in flight with their message ids and backstop deadlines, one table per shard.

    Supports ``len()``, ``in`` and iteration over the roots. Settling returns
    the entries found; a root that is not pending (settled already, never
    emitted here) is simply not found, which the spout counts as a late outcome.
    """

    def __init__(self, shard_count: int, timeout: float, replicas: int = 1) -> None:
        if shard_count < 1:
            raise ValueError("a spout needs at least one shard")
        self.timeout = timeout
        self.shard_count = shard_count
        # Roots live in the table of their owner shard; with replicas 2 the next shard keeps them too.
        self.replicas = replicas
        self.tables: list[dict[int, tuple[float, Any]]] = [{} for _ in range(shard_count)]
        self.clocks = [ShardClock(timeout) for _ in range(shard_count)]
        self._streams_down: set[int] = set()

    def __len__(self) -> int:
        return sum(map(len, self.tables))

    def __contains__(self, root: object) -> bool:
        try:
            key = operator.index(root)  # type: ignore[arg-type]
        except TypeError:
            return False
        return key in self.tables[key % self.shard_count]

    def __iter__(self) -> Iterator[int]:
        for table in self.tables:
            yield from table

    def deadline(self, shard: int, clock_now: float) -> float:
        """The deadline of an entry added to (or restarted on) ``shard`` at ``clock_now``."""
        return self.clocks[shard].now(clock_now) + self.timeout

    # -- adding ------------------------------------------------------------------

    def add(self, root: int, message_id: Any, clock_now: float) -> None:
        """Track one root."""
        shard = root % self.shard_count
        self.tables[shard][root] = (self.deadline(shard, clock_now), message_id)

    def add_many(self, roots: np.ndarray, message_ids: Sequence[Any], clock_now: float) -> None:
        """Track ``roots[i]`` with ``message_ids[i]`` for every i (one table update per shard)."""
        if self.shard_count == 1:
            entries = zip(repeat(self.deadline(0, clock_now)), message_ids)
            self.tables[0].update(zip(roots.tolist(), entries))
            return
        for shard, positions in shard_slices(roots, self.shard_count):
            at = positions.tolist()
            entries = zip(repeat(self.deadline(shard, clock_now)), [message_ids[i] for i in at])
            self.tables[shard].update(zip(roots[positions].tolist(), entries))

    # -- settling ----------------------------------------------------------------

    def pop(self, root: int) -> tuple[float, Any] | None:
        """Stop tracking ``root``: its ``(deadline, message_id)``, or None if it is not pending."""
        return self.tables[root % self.shard_count].pop(root, None)

    def pop_many(self, shard: int, roots: list[int]) -> list[tuple[float, Any] | None]:
        """:meth:`pop` for every root ``shard`` reported, in order (a repeated root is found once).

        With replicas 2 a shard reports the roots it owns and those it follows, so each root's own table is used.
        """
        if self.replicas > 1:
            return [self.pop(root) for root in roots]
        pop = self.tables[shard].pop
        return [pop(root, None) for root in roots]

    def pop_all(self) -> list[Any]:
        """Stop tracking everything; the message ids, shard by shard in deadline order."""
        message_ids = [entry[1] for table in self.tables for entry in table.values()]
        for table in self.tables:
            table.clear()
        return message_ids

    def pop_expired(self, clock_now: float) -> list[Any]:
        """Stop tracking every root whose deadline has passed; their message ids."""
        message_ids: list[Any] = []
        for table, clock in zip(self.tables, self.clocks):
            now = clock.now(clock_now)
            expired = []
            for root, (deadline, message_id) in table.items():
                if deadline > now:
                    break  # deadline order: the rest are later
                expired.append(root)
                message_ids.append(message_id)
            for root in expired:
                del table[root]
        return message_ids

    # -- restarting ------------------------------------------------------------

    def restart_many(self, shard: int, roots: list[int], clock_now: float) -> int:
        """Give each pending root of ``shard`` a fresh deadline (moved last: deadline order holds); how many."""
        if self.replicas > 1:  # a shard also resets the roots it follows: each root has its owner's table
            return sum(self._restart_in(owner, group, clock_now) for owner, group in self._by_owner(roots))
        return self._restart_in(shard, roots, clock_now)

    def _restart_in(self, shard: int, roots: list[int], clock_now: float) -> int:
        table = self.tables[shard]
        deadline = self.deadline(shard, clock_now)
        restarted = 0
        for root in roots:
            entry = table.pop(root, None)
            if entry is not None:
                table[root] = (deadline, entry[1])
                restarted += 1
        return restarted

    def _by_owner(self, roots: list[int]) -> list[tuple[int, list[int]]]:
        groups: dict[int, list[int]] = {}
        for root in roots:
            groups.setdefault(root % self.shard_count, []).append(root)
        return list(groups.items())

    # -- outcome streams -------------------------------------------------------------

    @property
    def streams_down(self) -> int:
        """How many shards' outcome streams are broken now."""
        return len(self._streams_down)

    def set_stream_down(self, shard: int, down: bool, clock_now: float) -> None:
        """``shard``'s outcome stream broke (or is back): pause the backstop of the trees it alone could report.

        A tree's backstop stands still only while the streams of all its replicas
        are down: with replicas 2, one replica's outage neither pauses nor fires
        it, since the other replica reports its outcome.
        """
        (self._streams_down.add if down else self._streams_down.discard)(shard)
        n = self.shard_count
        for k in range(self.replicas):
            owner = (shard - k) % n  # the tables whose trees ``shard`` keeps
            replicas = {(owner + j) % n for j in range(self.replicas)}
            self.clocks[owner].set_down(replicas <= self._streams_down, clock_now)


def _backstops(cluster: Any, wait: float | None) -> list[float]:
    """The backstop of each shard that answers Describe (``wait``: seconds each may take to connect)."""
    timeouts = []
    for shard in range(cluster.shard_count):
        try:
            info = cluster.describe(shard) if wait is None else cluster.describe(shard, wait=wait)
        except ShardUnavailable as exc:
            log.warning("backstop: %s", exc)
            continue
        timeouts.append(
            default_backstop(
                info.message_timeout_seconds,
                info.buckets,
                timeout_mode=info.timeout_mode or "fixed",  # "" from an acker older than the field
                max_tree_lifetime=info.max_tree_lifetime_seconds,
            )
        )
    return timeouts
