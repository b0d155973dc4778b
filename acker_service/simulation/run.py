"""One simulated run from a seed: the cluster, the traffic, the faults and moves, and the invariant checks.

Scenarios (drawn from the seed):

``reshard``  one replica, n to m ackers under load, sometimes back again; no crashes.
``drain``    one replica, n to n - 1 ackers, one of them leaving; no crashes.
``catchup``  two replicas: an acker is killed and restarted, and once it has
             caught up one of its partners is killed and restarted.
``crashes``  one or two replicas, acker kills at random moments.
``reshard-kill``  a reshard, and a kill of one of its ackers soon after it starts.
``reshard-replicas``  two replicas, a reshard (sometimes back) or a drain; no crashes; in half
             the runs one acker cut off from the clients for a while around the move's start.

Checked in every run: no false ack (an ACKED outcome from any acker for a tree
whose every ack had not been sent), exactly one spout callback per emit,
conservation on every ledger after every step, and bounded memory (after the
traffic, every ledger, hold and client queue is empty). In the first three
scenarios nothing may be replayed either: every tree ends as its bolts decided
(ACKED, FAILED or TIMED_OUT), never LOST or timed out because of a move.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from acker_protocol.wire import OpKind, Outcome

from ..outcome_columns import Resolution
from .acker import Layout, SimAcker
from .client import SimClient
from .events import NetworkFaults, World
from .transfer import Op

__all__ = ["BROKEN_VARIANTS", "SCENARIOS", "SimResult", "run_seed", "run_seeds"]

SCENARIOS = ("reshard", "drain", "catchup", "crashes", "reshard-kill", "reshard-replicas")
# Deliberately wrong protocols, each with the scenario that exercises it (the checks must catch them).
BROKEN_VARIANTS = {
    "catchup-xor": "catchup",  # the restarted replica applies at once and merges the snapshot by XOR
    "reshard-xor": "reshard",  # the new owner applies at once and merges the handoff by XOR
    "cut-late": "reshard",
    "handoff-no-keys": "reshard",  # a handoff carries no dedup keys, so a retry across the cut applies twice  # the cut is not atomic: moved roots are still served after their entries left
    "no-resend": "reshard-kill",  # an old owner does not hand its entries again to a new owner that restarted
    "client-skip": "catchup",  # a copy is skipped while the other replica is reachable, not once it applied
    "bound-skip": "catchup",  # a copy refused at the held-operation bound is skipped as for an unreachable replica
    # Two replicas: a copy refused by a newer layout goes to its new holder alone, the other copy's answer kept.
    "reroute-one-copy": "reshard-replicas",
    # Two replicas, the protocol before: at its cut the source hands its copy to both new keepers and the other
    # old keeper drops its own, so an update skipped at a lagging source is missing from both new copies.
    "source-to-both": "reshard-replicas",
}

MESSAGE_TIMEOUT = 10.0  # the ackers' timeout, simulated seconds
TRAFFIC_SECONDS = 6.0  # trees start in [0, TRAFFIC_SECONDS)
ACK_SPREAD = 1.5  # a tree's acks are sent within this long of its emit (some before the init arrives)
BACKSTOP = 2 * MESSAGE_TIMEOUT + 5.0  # the spout's own timeout, longer than the ackers'
END = TRAFFIC_SECONDS + BACKSTOP + 10.0  # by then every tree has its callback and every ledger drained
SPOUT = "spout"


@dataclass
class _Tree:
    root: int
    init_value: int
    acks: list[tuple[int, int]]  # (value, dedup key) per acked tuple
    kind: str  # "complete", "failed" (one tuple failed instead of acked) or "hung" (one ack never sent)
    odd_one: int  # the tuple failed or never acked
    sent: set[int] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return self.kind == "complete" and len(self.sent) == len(self.acks)


@dataclass
class SimResult:
    """One run: its seed, scenario, what went wrong (empty: every check held) and its trace if asked for."""

    seed: int
    scenario: str
    failures: list[str]
    trees: int
    outcomes: dict[str, int]
    trace: list[str] | None = None
    tally: dict[str, int] = field(default_factory=dict)  # batches, chunks, refusals at the held bound


class _Run:
    def __init__(
        self, seed: int, broken: str | None, trace: bool, scenario: str | None = None, tight_bound: bool = False
    ) -> None:
        if broken is not None and broken not in BROKEN_VARIANTS:
            raise ValueError(f"unknown broken variant {broken!r}; choose from {sorted(BROKEN_VARIANTS)}")
        if scenario is not None and scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; choose from {list(SCENARIOS)}")
        self.rng = rng = random.Random(seed)
        self.seed = seed
        # A broken variant or a named scenario is not drawn, so the same seed runs the same world under either.
        self.scenario = scenario or (BROKEN_VARIANTS[broken] if broken else rng.choice(SCENARIOS))
        self.broken = broken
        self.trace: list[str] | None = [] if trace else None
        faults = NetworkFaults(
            loss=rng.uniform(0.0, 0.15),
            duplicate=rng.uniform(0.0, 0.1),
            max_delay=rng.choice((0.01, 0.05, 0.2)),
        )
        self.world = World(rng, faults, self.trace)
        self.failures: list[str] = []
        self.trees: dict[int, _Tree] = {}
        self.callbacks: dict[int, list[Outcome]] = {}
        self.strict = self.scenario not in ("crashes", "reshard-kill")
        if self.scenario in ("catchup", "reshard-replicas"):
            replicas, n = 2, rng.randint(2, 4)
        elif self.scenario == "drain":
            replicas, n = 1, rng.randint(2, 4)
        elif self.scenario in ("reshard", "reshard-kill"):
            replicas, n = 1, rng.randint(1, 4)
        else:
            replicas = rng.choice((1, 2))
            n = rng.randint(2 if replicas == 2 else 1, 4)
        self.replicas = replicas
        # Half the runs bound the held operations tightly (--max-held-operations), so batches are refused at it.
        tight_bound = tight_bound or broken == "bound-skip"
        self.max_held = rng.randint(1, 6) if tight_bound or rng.random() < 0.5 else 0
        layout = Layout(0, tuple(range(n)))
        self._layout = layout  # the controller's view: the layout of the last finished move
        self._move: tuple[Layout, Layout] | None = None  # (old, new) while a move is under way
        self.world.log(
            f"seed {seed}: scenario {self.scenario}, {n} ackers, replicas {replicas}, "
            f"max held {self.max_held or 'unbounded'}, {faults}"
        )
        self.ackers: dict[int, SimAcker] = {}
        for ident in range(n + 4):  # spare ackers a reshard may add
            self.ackers[ident] = SimAcker(
                self.world,
                ident,
                layout,
                replicas,
                MESSAGE_TIMEOUT,
                self._emitted,
                self._problem,
                broken,
                max_held=self.max_held,
            )
        for acker in self.ackers.values():
            acker.peers = self.ackers
            acker.tick(END)
        self.clients = [SimClient(self.world, self.ackers, layout, replicas, broken) for _ in range(2)]

    def _problem(self, message: str) -> None:
        self.world.log("FAILURE " + message)
        self.failures.append(f"t={self.world.now:.4f}: {message}")

    # -- traffic --

    def _draw_tree(self) -> _Tree:
        rng = self.rng
        root = rng.getrandbits(64) or 1
        acks: list[tuple[int, int]] = []
        init_value = 0
        for _ in range(rng.randint(1, 3)):  # spout tuples, one edge each
            edge = rng.getrandbits(64) | 1
            init_value ^= edge
            children = [rng.getrandbits(64) | 1 for _ in range(rng.randint(0, 2))]
            out = 0
            for child in children:
                out ^= child
                acks.append((child, rng.getrandbits(64) | 1))  # the leaf's ack
            acks.append((edge ^ out, rng.getrandbits(64) | 1))
        kind = rng.choices(("complete", "failed", "hung"), (0.7, 0.15, 0.15))[0]
        return _Tree(root, init_value, acks, kind, rng.randrange(len(acks)))

    def _emit(self) -> None:
        tree = self._draw_tree()
        if tree.root in self.trees:
            return
        self.trees[tree.root] = tree
        self.callbacks[tree.root] = []
        client = self.rng.choice(self.clients)
        client.submit(Op(OpKind.INIT, tree.root, tree.init_value, 0, SPOUT))
        self.world.at(BACKSTOP, self._backstop, tree.root)
        for i in range(len(tree.acks)):
            self.world.at(self.rng.uniform(0.0, ACK_SPREAD), self._bolt_ack, tree, i)

    def _bolt_ack(self, tree: _Tree, i: int) -> None:
        client = self.rng.choice(self.clients)
        if i == tree.odd_one and tree.kind == "failed":
            client.submit(Op(OpKind.FAIL, tree.root))
            return
        if i == tree.odd_one and tree.kind == "hung":
            return
        value, key = tree.acks[i]
        tree.sent.add(i)
        client.submit(Op(OpKind.ACK, tree.root, value, key))
        if self.rng.random() < 0.05:
            # A Spark task run twice: the same ack with the same attempt key, from another client.
            self.world.at(
                self.rng.uniform(0.0, 0.5), self.rng.choice(self.clients).submit, Op(OpKind.ACK, tree.root, value, key)
            )

    # -- outcomes --

    def _emitted(self, acker: SimAcker, resolutions: list[Resolution]) -> None:
        for res in resolutions:
            tree = self.trees.get(res.root)
            if tree is None:
                continue
            if res.outcome == Outcome.ACKED and not tree.complete:
                self._problem(
                    f"false ack: acker {acker.ident} ACKED root {res.root:#x} ({tree.kind}, "
                    f"{len(tree.sent)} of {len(tree.acks)} acks sent)"
                )
            self.world.log(f"acker {acker.ident} ends {res.root:#x} {res.outcome.name}")
            self.world.at(self.rng.uniform(0.001, 0.05), self._deliver, acker, acker.incarnation, res)

    def _deliver(self, acker: SimAcker, incarnation: int, res: Resolution) -> None:
        if not acker.up or acker.incarnation != incarnation:
            return  # the outcome stream broke with the process, retained outcomes with it
        self._callback(res.root, Outcome(res.outcome))

    def _backstop(self, root: int) -> None:
        self._callback(root, Outcome.LOST)

    def _callback(self, root: int, outcome: Outcome) -> None:
        calls = self.callbacks[root]
        if not calls:  # the spout settles on the first outcome and ignores the rest
            calls.append(outcome)
            self.world.log(f"spout callback {root:#x} {outcome.name}")

    # -- moves --

    def _reshard(self, layout: Layout, then: Layout | None) -> None:
        old = self._layout
        members = sorted(set(old.ackers) | set(layout.ackers))
        self.world.log(f"reshard to epoch {layout.epoch} {layout.ackers}")
        self._move = (old, layout)
        if self.scenario == "reshard-kill":
            victim = self.rng.choice(members)
            self.world.at(self.rng.uniform(0.0, 1.0), self._crash, victim, self.rng.uniform(0.3, 1.5), None)
        prepared: set[int] = set()
        cut: set[int] = set()

        def send_prepare() -> None:
            missing = [m for m in members if m not in prepared]
            if not missing:
                send_cut()
                return
            for m in missing:
                self.world.send(self.ackers[m].prepare, layout, prepared.add)
            self.world.at(0.2, send_prepare)

        def send_cut() -> None:
            missing = [m for m in old.ackers if m not in cut]
            if not missing:
                self.world.at(0.1, wait_done)
                return
            for m in missing:
                self.world.send(self.ackers[m].cut, layout.epoch, cut.add)
            self.world.at(0.2, send_cut)

        def wait_done() -> None:
            if any(self.ackers[m].moving or not self.ackers[m].up for m in members):
                self.world.at(0.1, wait_done)
                return
            self.world.log(f"reshard to epoch {layout.epoch} done")
            self._layout = layout
            self._move = None
            if then is not None:
                self.world.at(self.rng.uniform(0.2, 1.5), self._reshard, then, None)

        send_prepare()

    def _crash(self, ident: int, down: float, then: int | None) -> None:
        self.ackers[ident].crash()
        for client in self.clients:
            self.world.at(self.rng.uniform(0.001, 0.05), client.acker_down, ident)
        self.world.at(down, self._restart, ident, then)

    def _restart(self, ident: int, then: int | None) -> None:
        self.ackers[ident].restart(self._move)
        if then is not None:
            self._after_catchup(ident, then)

    def _after_catchup(self, ident: int, partner: int) -> None:
        if not self.ackers[ident].caught_up:
            self.world.at(0.05, self._after_catchup, ident, partner)
            return
        self.world.log(f"acker {ident} caught up")
        self.world.at(self.rng.uniform(0.0, 1.0), self._crash, partner, self.rng.uniform(0.5, 2.0), None)

    def _schedule_moves(self) -> None:
        rng = self.rng
        n = len(self.ackers) - 4
        layout = Layout(0, tuple(range(n)))
        if self.scenario in ("reshard", "reshard-kill"):
            m = rng.choice([k for k in range(1, 6) if k != n])
            target = Layout(1, tuple(range(m)))
            back = Layout(2, layout.ackers) if rng.random() < 0.5 else None
            self.world.at(rng.uniform(0.5, 4.0), self._reshard, target, back)
        elif self.scenario == "reshard-replicas":
            start = rng.uniform(0.5, 4.0)
            if n >= 3 and rng.random() < 0.3:  # a drain: two replicas need two ackers left
                leaving = rng.randrange(n)
                target = Layout(1, tuple(a for a in layout.ackers if a != leaving))
                self.world.at(start, self._reshard, target, None)
            else:
                m = rng.choice([k for k in range(2, 6) if k != n])
                target = Layout(1, tuple(range(m)))
                back = Layout(2, layout.ackers) if rng.random() < 0.5 else None
                self.world.at(start, self._reshard, target, back)
            if rng.random() < 0.5:
                # One acker the clients cannot reach for a while, around the move's start, while it stays up
                # and takes its cut: the copies they skip there (the other copy applied) it never catches up on.
                victim = rng.choice(sorted(set(layout.ackers) | set(target.ackers)))
                cut_off = max(0.0, start - rng.uniform(0.0, 1.5))
                self.world.at(cut_off, self._partition, victim, rng.uniform(0.2, 1.5))
        elif self.scenario == "drain":
            leaving = rng.randrange(n)
            target = Layout(1, tuple(a for a in layout.ackers if a != leaving))
            self.world.at(rng.uniform(0.5, 4.0), self._reshard, target, None)
        elif self.scenario == "catchup":
            victim = rng.randrange(n)
            partner = (victim + rng.choice((1, -1))) % n
            self.world.at(rng.uniform(0.5, 3.0), self._crash, victim, rng.uniform(0.5, 2.0), partner)
        else:
            for _ in range(rng.randint(1, 3)):
                self.world.at(rng.uniform(0.5, 8.0), self._crash_if_up, rng.randrange(n))

    def _partition(self, ident: int, seconds: float) -> None:
        """The clients lose ``ident`` for ``seconds`` (it stays up: the ackers, its outcome stream, the controller reach it)."""
        self.ackers[ident].partitioned = True
        self.world.log(f"acker {ident} unreachable from the clients for {seconds:.2f} s")
        self.world.at(seconds, self._heal, ident)

    def _heal(self, ident: int) -> None:
        self.ackers[ident].partitioned = False
        self.world.log(f"acker {ident} reachable again")

    def _crash_if_up(self, ident: int) -> None:
        if self.ackers[ident].up:
            self._crash(ident, self.rng.uniform(0.5, 2.0), None)

    # -- the run and its checks --

    def run(self) -> SimResult:
        rng = self.rng
        for _ in range(rng.randint(10, 60)):
            self.world.at(rng.uniform(0.0, TRAFFIC_SECONDS), self._emit)
        self._schedule_moves()
        self.world.run_until(END)
        self._final_checks()
        outcomes: dict[str, int] = {}
        for calls in self.callbacks.values():
            for outcome in calls:
                outcomes[outcome.name] = outcomes.get(outcome.name, 0) + 1
        return SimResult(
            self.seed, self.scenario, self.failures, len(self.trees), outcomes, self.trace, dict(self.world.tally)
        )

    def _final_checks(self) -> None:
        expected = {"complete": Outcome.ACKED, "failed": Outcome.FAILED, "hung": Outcome.TIMED_OUT}
        for root, calls in self.callbacks.items():
            tree = self.trees[root]
            if len(calls) != 1:
                self._problem(f"root {root:#x} got {len(calls)} spout callbacks, not exactly one")
            elif self.strict and calls[0] != expected[tree.kind]:
                self._problem(f"root {root:#x} ({tree.kind}) ended {calls[0].name}: replayed without a lost acker")
        for acker in self.ackers.values():
            if not acker.up:
                continue
            acker.check_conservation()
            left = acker.ledger.pending_roots()
            if left or acker.held or acker.catch_held or acker.moving or acker.catching or acker.early_chunks:
                self._problem(
                    f"acker {acker.ident} not drained after the traffic: {len(left)} entries, "
                    f"holds {sum(map(len, acker.held.values()))}+{sum(map(len, acker.catch_held.values()))}, "
                    f"moving {acker.moving}, catching up {sorted(acker.catching)}"
                )
        for i, client in enumerate(self.clients):
            if client.in_flight:
                self._problem(f"client {i} still has {client.in_flight} operations in flight")


def run_seed(
    seed: int, broken: str | None = None, *, trace: bool = False, scenario: str | None = None, tight_bound: bool = False
) -> SimResult:
    """Run the simulation drawn from ``seed`` (``broken``: a deliberately wrong protocol from BROKEN_VARIANTS).

    ``scenario`` (one of SCENARIOS) and ``tight_bound`` (a bound of 1 to 6
    held operations) fix what the seed would draw, as a broken variant fixes
    its own: ``run_seed(s, scenario="catchup", tight_bound=True)`` is the world
    of ``run_seed(s, "bound-skip")`` under the correct rules.
    """
    return _Run(seed, broken, trace, scenario, tight_bound).run()


def run_seeds(seeds: Iterable[int], broken: str | None = None) -> dict[str, object]:
    """Run every seed; the summary ``acker-bench --mode simulate --json`` prints."""
    started = time.perf_counter()  # reported only, never part of a run
    count = 0
    failing: list[int] = []
    scenarios: dict[str, int] = {}
    tally: dict[str, int] = {}
    first_failure: str | None = None
    for seed in seeds:
        result = run_seed(seed, broken)
        count += 1
        for what, n in result.tally.items():
            tally[what] = tally.get(what, 0) + n
        scenarios[result.scenario] = scenarios.get(result.scenario, 0) + 1
        if result.failures:
            failing.append(seed)
            if first_failure is None:
                first_failure = result.failures[0]
    return {
        "seeds": count,
        "failures": len(failing),
        "first_failing_seed": failing[0] if failing else None,
        "first_failure": first_failure,
        "failing_seeds": failing[:20],
        "scenarios": scenarios,
        "tally": tally,
        "broken": broken,
        "seconds": round(time.perf_counter() - started, 2),
    }
