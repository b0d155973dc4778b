"""acker-bench --mode reshard: move a loaded cluster from n to m ackers (and back) under steady load.

Embedded ackers (``AckerServer`` in this process, free ports on 127.0.0.1)
start as n shards plus the extra ones a grow needs. ``--pending-trees`` trees
are left pending (init and a first ack), then a steady workload starts
complete trees (init, two acks) at a fixed pace and times each from its init
to its ACKED outcome. The move (``acker-ctl reshard``'s steps) runs from n to
m, and with ``--back`` from m to n again. At the end every pending tree gets
its last ack, except a tenth kept incomplete.

Figures: trees moved and the time each move took (all of it, and from the
first cut to the last commit: a root moving to a new owner waits at most about
that long), lost (a tree without an outcome), replayed (a complete tree that
did not end ACKED: its spout would replay it), false acks (an incomplete tree
ACKED), trees with more than one outcome, and the latency of the steady trees
before the first move (p99), while a move was running (p50 and p99: three
quarters of the roots move in a 3 -> 4 move and wait for their handoff, the
rest are served at once) and after; the p99 during a move also for the roots the first
move gives a new owner and for those it leaves in place.

With ``--replicas 2`` the ackers keep every tree twice and the move carries both
copies (a root moves when its set of two holders changes); the client sends
every operation to both holders, and every holder reports each tree, so
"more than one outcome" counts the trees whose reports disagree.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass

import numpy as np
from acker_client import ClusterClient
from acker_client.subscription import OutcomeSubscription
from acker_ctl.reshard import reshard
from acker_protocol.wire import Outcome

from acker_service.config import ServerConfig
from acker_service.server import AckerServer

__all__ = ["ReshardBench", "run_reshard"]

SPOUT = "reshard-bench"
_LOAD_CHUNK = 50_000


class _Outcomes:
    """Outcomes of SPOUT from every acker the client has routed to, with their arrival times."""

    def __init__(self, cluster: ClusterClient) -> None:
        self.cluster = cluster
        self.cond = threading.Condition()
        self.count: dict[int, int] = {}
        self.first: dict[int, tuple[int, float]] = {}
        self.kinds: dict[int, list[int]] = {}  # every outcome reported per root (two replicas: one per holder)
        self.subs: dict[str, OutcomeSubscription] = {}
        self.follow(cluster.addresses)
        cluster.add_layout_listener(self.follow)

    def follow(self, addresses) -> None:
        for shard, address in enumerate(addresses):
            if address not in self.subs:
                sub = OutcomeSubscription(self.cluster, shard, SPOUT, deliver_batch=self._deliver)
                sub.address = address
                self.subs[address] = sub.start()

    def _deliver(self, roots: np.ndarray, outcomes: np.ndarray, _latency: np.ndarray) -> None:
        now = time.monotonic()
        with self.cond:
            for root, outcome in zip(roots.tolist(), outcomes.tolist()):
                self.count[root] = self.count.get(root, 0) + 1
                self.kinds.setdefault(root, []).append(outcome)
                self.first.setdefault(root, (outcome, now))
            self.cond.notify_all()

    def wait_count(self, n: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.first) >= n, timeout)

    def close(self) -> None:
        for sub in self.subs.values():
            sub.close()


@dataclass
class ReshardBench:
    """The settings of one run."""

    start: int = 3
    to: int = 4
    back: bool = True
    pending_trees: int = 100_000
    rate: float = 500.0  # steady complete trees per second
    steady_seconds: float = 3.0
    message_timeout: float = 120.0
    engine: str = "native"
    replicas: int = 1  # 2: every tree is kept by two ackers and both copies move


def _holders(root: int, addresses: list[str], replicas: int) -> frozenset[str]:
    """The ackers keeping ``root`` in a layout of ``addresses``: a root moves when this set changes."""
    return frozenset(addresses[(root + k) % len(addresses)] for k in range(replicas))


def _ids(n: int) -> np.ndarray:
    ids = np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64).copy()
    ids[ids == 0] = 1
    return ids


def run_reshard(bench: ReshardBench) -> dict:
    """One run; the figures as a JSON-ready dict."""
    if bench.start < 1 or bench.to < 1 or bench.start == bench.to:
        raise ValueError("--from and --to must be different positive shard counts")
    if bench.replicas not in (1, 2):
        raise ValueError(f"--replicas must be 1 or 2, got {bench.replicas}")
    if min(bench.start, bench.to) < bench.replicas:
        raise ValueError(f"--replicas {bench.replicas} needs at least {bench.replicas} ackers in both layouts")
    size = max(bench.start, bench.to)
    servers = []
    try:
        for i in range(size):
            count = bench.start if i < bench.start else size
            config = ServerConfig(host="127.0.0.1", port=0, grace=0.5, shard_index=i, shard_count=count,
                                  message_timeout=bench.message_timeout, engine=bench.engine,
                                  replicas=bench.replicas)  # fmt: skip
            server = AckerServer(config)
            server.start()
            servers.append(server)
        addresses = [s.address for s in servers]
        return _run(bench, addresses)
    finally:
        for server in servers:
            server.stop(0)


def _run(bench: ReshardBench, addresses: list[str]) -> dict:
    first, second = addresses[: bench.start], addresses[: bench.to]
    client = ClusterClient(first, flush_interval=0.001, wait_for_shard=120.0, replicas=bench.replicas)
    outcomes = _Outcomes(client)
    # The trees that move: pending, their last ack held back.
    roots, a, b = _ids(bench.pending_trees), _ids(bench.pending_trees), _ids(bench.pending_trees)
    for lo in range(0, len(roots), _LOAD_CHUNK):
        part = slice(lo, lo + _LOAD_CHUNK)
        client.init_columns(roots[part], a[part] ^ b[part], SPOUT)
        client.ack_columns(roots[part], a[part])
        client.flush()
    emitted: dict[int, float] = {}
    phase: dict[int, str] = {}
    state = {"phase": "steady"}
    stop = threading.Event()

    def steady() -> None:
        period = 1.0 / bench.rate
        next_at = time.monotonic()
        while not stop.is_set():
            root, x, y = int(_ids(1)[0]), secrets.randbits(64), secrets.randbits(64)
            emitted[root] = time.monotonic()
            phase[root] = state["phase"]
            client.init(root, x ^ y, SPOUT)
            client.ack(root, x)
            client.ack(root, y)
            next_at += period
            pause = next_at - time.monotonic()
            if pause > 0:
                stop.wait(pause)

    worker = threading.Thread(target=steady, name="reshard-bench-steady")
    worker.start()
    moves = []
    try:
        time.sleep(bench.steady_seconds)
        plan = [(first, second)] + ([(second, first)] if bench.back else [])
        for old, new in plan:
            state["phase"] = "during"
            moves.append(reshard(old, new, None, deadline=120.0, wait_leaving=0.0))
            state["phase"] = "after"
            time.sleep(bench.steady_seconds)
    finally:
        stop.set()
        worker.join()
    keep = len(roots) // 10  # never completed: must not end ACKED
    done = slice(keep, len(roots))
    for lo in range(keep, len(roots), _LOAD_CHUNK):
        part = slice(lo, min(lo + _LOAD_CHUNK, len(roots)))
        client.ack_columns(roots[part], b[part])
    client.flush()
    expected_outcomes = len(emitted) + len(roots) - keep
    outcomes.wait_count(expected_outcomes, timeout=60.0)
    with outcomes.cond:
        first_seen = dict(outcomes.first)
        counts = dict(outcomes.count)
    completed = list(emitted) + roots[done].tolist()
    incomplete = roots[:keep].tolist()
    lost = sum(1 for r in completed if r not in first_seen)
    replayed = sum(1 for r in completed if r in first_seen and first_seen[r][0] != Outcome.ACKED)
    false_acks = sum(1 for r in incomplete if r in first_seen and first_seen[r][0] == Outcome.ACKED)
    if bench.replicas > 1:
        # Every holder reports a tree (an old and a new one may, across a move): the spout settles on the
        # first, so what matters is whether the reports disagree.
        with outcomes.cond:
            kinds = {r: set(k) for r, k in outcomes.kinds.items()}
        repeated = sum(1 for r in completed + incomplete if len(kinds.get(r, ())) > 1)
    else:
        repeated = sum(1 for r in completed + incomplete if counts.get(r, 0) > 1)
    holders_first = {r: _holders(r, first, bench.replicas) for r in emitted}

    def pct(which: str, q: float = 99, moving: bool | None = None) -> float | None:
        lat = [
            (first_seen[r][1] - t) * 1000
            for r, t in emitted.items()
            if phase[r] == which
            and r in first_seen
            and (moving is None or (holders_first[r] != _holders(r, second, bench.replicas)) == moving)
        ]
        return round(float(np.percentile(lat, q)), 2) if lat else None

    outcomes.close()
    client.close()
    return {
        "mode": "reshard",
        "engine": bench.engine,
        "replicas": bench.replicas,
        "from": bench.start,
        "to": bench.to,
        "back": bench.back,
        "pending_trees": bench.pending_trees,
        "moved_trees": sum(m["moved_trees"] for m in moves),
        "move_seconds": round(max(m["move_seconds"] for m in moves), 3),
        "moves": [
            {k: m[k] for k in ("from_shards", "to_shards", "moved_trees", "move_seconds", "cut_seconds")} for m in moves
        ],
        "steady_trees": len(emitted),
        "lost": lost,
        "replayed": replayed,
        "false_acks": false_acks,
        "more_than_one_outcome": repeated,
        "p99_ms_steady": pct("steady"),
        "p50_ms_during": pct("during", 50),
        "p99_ms_during": pct("during"),
        # The roots the first move gives a new owner, and those it leaves where they are (the
        # second tells what a move costs every root: the client's re-routing, shared CPU).
        "p99_ms_during_moving": pct("during", moving=True),
        "p99_ms_during_staying": pct("during", moving=False),
        "p99_ms_after": pct("after"),
    }
