"""What a spout remembers so that a tree kept by two ackers still ends in exactly one callback.

With a replication factor of 2 both ackers that keep a tree report its outcome.
The spout settles the tree on the first decisive outcome (ACKED, FAILED or
TIMED_OUT); the second replica's outcome for it is a *duplicate*, counted and
ignored, never a second callback. And a tree's init is missed only when every
replica missed it: one replica's dropped batch is no reason to fail the record.

:class:`ReplicaOutcomes` keeps both memories, bounded: a root settled by one
replica waits here for its partner's outcome, and a root whose init one
replica missed waits for the other's verdict, each for at most ``horizon``
seconds (the spout's backstop), after which the partner's outcome can no
longer come (its acker would have expired the tree) or the backstop has
already settled the record. Not thread-safe: the spout's lock guards it.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ReplicaOutcomes"]


class ReplicaOutcomes:
    """The partner outcomes still expected, and the inits some replicas missed, for a spout with ``replicas`` 2."""

    def __init__(self, replicas: int, horizon: float) -> None:
        self.replicas = replicas
        self.horizon = horizon
        # root -> clock time one replica's outcome settled it; its partner's outcome is a duplicate.
        self._echoes: dict[int, float] = {}
        # root -> (replicas that missed its init so far, clock time of the first miss).
        self._missed: dict[int, tuple[int, float]] = {}

    def __len__(self) -> int:
        return len(self._echoes) + len(self._missed)

    def settled(self, roots: Iterable[int], clock_now: float) -> None:
        """``roots`` were just settled by an acker's outcome: their partner replica's outcome is still to come."""
        if self.replicas > 1:
            self._echoes.update(dict.fromkeys(roots, clock_now))

    def duplicates(self, roots: Iterable[int]) -> int:
        """Of outcomes for ``roots`` (none of them pending), how many are a partner's second outcome (forgotten now)."""
        pop = self._echoes.pop
        return sum(1 for root in roots if pop(root, None) is not None)

    def missed_inits(self, roots: Iterable[int], clock_now: float) -> list[int]:
        """One replica missed the inits of ``roots``: those every replica has now missed (their records are lost)."""
        if self.replicas == 1:
            return list(roots)
        lost = []
        for root in roots:
            count, since = self._missed.get(root, (0, clock_now))
            if count + 1 >= self.replicas:
                self._missed.pop(root, None)
                lost.append(root)
            else:
                self._missed[root] = (count + 1, since)
        return lost

    def prune(self, clock_now: float) -> None:
        """Forget what is older than the horizon (insertion order is time order: only the fronts are read)."""
        cutoff = clock_now - self.horizon
        for table, when in ((self._echoes, lambda v: v), (self._missed, lambda v: v[1])):
            while table:
                root = next(iter(table))
                if when(table[root]) > cutoff:
                    break
                del table[root]
