"""A tree workload for the reshard tests: every emit's one outcome, collected from every acker the layouts name.

Each tree is ``init(root, a ^ b)``, then ``ack(root, a)`` and, for complete
trees, ``ack(root, b)``: a complete tree must end ACKED exactly once, an
incomplete one must never end ACKED (it times out). Outcomes are read from
every acker's stream by :class:`OutcomeSubscription`, which a layout change
extends to the ackers it adds, so the four invariants can be counted.
"""

from __future__ import annotations

import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from acker_client import ClusterClient
from acker_client.subscription import OutcomeSubscription
from acker_protocol.wire import Outcome

SPOUT = "reshard-spout"


class Outcomes:
    """Every outcome of ``SPOUT`` from every acker ``cluster`` has routed to (following layout changes)."""

    def __init__(self, cluster: ClusterClient) -> None:
        self.cluster = cluster
        self.lock = threading.Condition()
        self.by_root: dict[int, list[int]] = {}
        self._subs: dict[str, OutcomeSubscription] = {}
        self.follow(cluster.addresses)
        cluster.add_layout_listener(self.follow)

    def follow(self, addresses) -> None:
        """Subscribe to each acker not yet followed."""
        for shard, address in enumerate(addresses):
            if address not in self._subs:
                sub = OutcomeSubscription(self.cluster, shard, SPOUT, deliver_batch=self._deliver)
                sub.address = address
                self._subs[address] = sub.start()

    def _deliver(self, roots, outcomes, _latency) -> None:
        with self.lock:
            for root, outcome in zip(roots.tolist(), outcomes.tolist()):
                self.by_root.setdefault(root, []).append(outcome)
            self.lock.notify_all()

    def wait_for(self, roots, timeout: float) -> bool:
        """Wait until every root has an outcome (a condition wait, not a timed assertion)."""
        with self.lock:
            return self.lock.wait_for(lambda: all(r in self.by_root for r in roots), timeout)

    def close(self) -> None:
        """Stop every subscription."""
        for sub in self._subs.values():
            sub.close()


class Trees:
    """Trees emitted through one client: which are complete, which roots still miss their last ack."""

    def __init__(self, cluster: ClusterClient) -> None:
        self.cluster = cluster
        self.complete: dict[int, int] = {}  # root -> the last ack's value, not sent yet
        self.incomplete: set[int] = set()
        self.done: set[int] = set()

    def start(self, n: int, incomplete_every: int = 5) -> None:
        """Emit ``n`` trees with their first ack; every ``incomplete_every``-th never gets its last ack."""
        for i in range(n):
            root, a, b = secrets.randbits(64) or 1, secrets.randbits(64), secrets.randbits(64)
            self.cluster.init(root, a ^ b, SPOUT)
            self.cluster.ack(root, a)
            if i % incomplete_every == 0:
                self.incomplete.add(root)
            else:
                self.complete[root] = b

    def finish(self, k: int | None = None) -> None:
        """Send the last ack of up to ``k`` started complete trees (all when None)."""
        roots = list(self.complete)[: k if k is not None else len(self.complete)]
        for root in roots:
            self.cluster.ack(root, self.complete.pop(root))
            self.done.add(root)

    def verdict(self, outcomes: Outcomes, replicas: int = 1) -> Counter:
        """Counts of what happened to every tree: the invariants read off it.

        With two replicas every keeper of a tree reports it (and an old holder as
        well as a new one may, across a move): the spout settles on the first and
        ignores the rest, so "more than one outcome" counts the trees whose
        reports disagree, what would make that first one matter.
        """
        c: Counter = Counter()
        with outcomes.lock:
            for root in self.done | self.incomplete:
                seen = outcomes.by_root.get(root, [])
                c["emitted"] += 1
                if not seen:
                    c["lost"] += 1
                if (len(set(seen)) if replicas > 1 else len(seen)) > 1:
                    c["more_than_one_outcome"] += 1
                if root in self.done and seen and seen[0] != Outcome.ACKED:
                    c["replayed"] += 1  # a complete tree that did not end ACKED would be replayed
                if root in self.incomplete and Outcome.ACKED in seen:
                    c["false_acks"] += 1
        return c


class Rounds:
    """Counts a background workload's rounds; a test's next step waits for a few more (progress since the last)."""

    def __init__(self) -> None:
        self.count = 0
        self.progress = threading.Condition()

    def one_more(self) -> None:
        """The workload finished a round."""
        with self.progress:
            self.count += 1
            self.progress.notify_all()

    def wait_for_more(self, k: int = 3) -> None:
        """Wait until the workload made ``k`` more rounds (60 s at most, else the test fails)."""
        with self.progress:
            target = self.count + k
            assert self.progress.wait_for(lambda: self.count >= target, timeout=60), "the workload made no progress"


@contextmanager
def running_workload(client: ClusterClient, trees: Trees) -> Iterator[Rounds]:
    """Trees started and (four in five) finished through ``client`` in a loop on a thread, until the block ends."""
    stop, rounds = threading.Event(), Rounds()

    def workload() -> None:
        while not stop.is_set():
            trees.start(20)
            trees.finish(15)
            client.flush()
            rounds.one_more()

    worker = threading.Thread(target=workload)
    worker.start()
    try:
        yield rounds
    finally:
        stop.set()
        worker.join()
