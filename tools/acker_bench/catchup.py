"""acker-bench --mode catchup: a replica restarts under load, copies its ranges, then its partner is lost.

Three embedded ackers (``AckerServer`` in this process, free ports on
127.0.0.1) run with ``--replicas 2`` and each other's addresses (``--peers``).
``--pending-trees`` trees are left pending (init and a first ack), and a
steady workload starts complete trees (init, two acks) at a fixed pace. Then
shard 1 is stopped (its ledger gone, as at kill -9), more pending trees are
started while it is down, and it is started again: it holds the operations of each of its two ranges until it
has copied that range from shard 0 or 2 (the catch-up), then applies them. Once
it is caught up, shard 2 (the other keeper of the roots shard 1 owns) is
stopped for good. At the end every pending tree gets its last ack, except a
tenth kept incomplete.

Figures: trees copied, the catch-up's time (from the first copy asked for to
caught up) and how long Apply was held (from the restart), lost (a tree
without an outcome), replayed (a complete tree whose first outcome is not
ACKED: its spout would replay it), false acks (an incomplete tree ACKED), and
the steady trees' p99 latency before the restart and while it caught up.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass

import numpy as np
from acker_client import ClusterClient
from acker_protocol.wire import Outcome

from acker_service.config import ServerConfig
from acker_service.process_cluster import _free_ports
from acker_service.server import AckerServer

from .reshard import _ids, _Outcomes

__all__ = ["CatchUpBench", "run_catchup"]

SPOUT = "reshard-bench"  # the outcome collector of the reshard bench listens to this spout
_LOAD_CHUNK = 50_000
RESTARTED, PARTNER = 1, 2


@dataclass
class CatchUpBench:
    """The settings of one run."""

    pending_trees: int = 100_000
    rate: float = 500.0  # steady complete trees per second
    steady_seconds: float = 2.0
    message_timeout: float = 300.0
    catchup_delay: float = 2.0
    engine: str = "native"


def _config(bench: CatchUpBench, shard: int, ports: list[int]) -> ServerConfig:
    return ServerConfig(
        host="127.0.0.1", port=ports[shard], grace=0.5, shard_index=shard, shard_count=len(ports), replicas=2,
        peers=",".join(f"127.0.0.1:{p}" for p in ports), catchup_delay=bench.catchup_delay,
        message_timeout=bench.message_timeout, engine=bench.engine,
    )  # fmt: skip


def run_catchup(bench: CatchUpBench) -> dict:
    """One run; the figures as a JSON-ready dict."""
    ports = _free_ports("127.0.0.1", 3)
    servers: list[AckerServer] = []
    try:
        for shard in range(3):
            # Started together, each finds its partners empty ("lost"): a fresh cluster is caught up at once.
            servers.append(AckerServer(_config(bench, shard, ports)).start())
        for server in servers:
            _wait_caught_up(server, 60.0)
        return _run(bench, servers, ports)
    finally:
        for server in servers:
            server.stop(0)


def _wait_caught_up(server: AckerServer, timeout: float) -> float:
    """Wait until ``server`` holds Apply no more; when that was (monotonic)."""
    give_up = time.monotonic() + timeout
    while server.call(lambda: server.shard.membership.catchup.holding):
        if time.monotonic() > give_up:
            raise RuntimeError(f"shard {server.config.shard_index} did not catch up in {timeout:g} s")
        time.sleep(0.01)
    return time.monotonic()


def _load(client: ClusterClient, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Start ``n`` pending trees (init and first ack); their roots and the last acks held back."""
    roots, a, b = _ids(n), _ids(n), _ids(n)
    for lo in range(0, n, _LOAD_CHUNK):
        part = slice(lo, lo + _LOAD_CHUNK)
        client.init_columns(roots[part], a[part] ^ b[part], SPOUT)
        client.ack_columns(roots[part], a[part])
        client.flush()
    return roots, b


def _run(bench: CatchUpBench, servers: list[AckerServer], ports: list[int]) -> dict:
    addresses = [s.address for s in servers]
    client = ClusterClient(addresses, flush_interval=0.001, wait_for_shard=120.0)
    outcomes = _Outcomes(client)
    before_roots, before_b = _load(client, bench.pending_trees // 2)
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

    worker = threading.Thread(target=steady, name="catchup-bench-steady")
    worker.start()
    try:
        time.sleep(bench.steady_seconds)
        state["phase"] = "outage"
        servers[RESTARTED].stop(0)  # its ledger is gone, as at kill -9
        during_roots, during_b = _load(client, bench.pending_trees - bench.pending_trees // 2)
        state["phase"] = "catching-up"
        restarted_at = time.monotonic()
        servers[RESTARTED] = AckerServer(_config(bench, RESTARTED, ports)).start()
        caught_up_at = _wait_caught_up(servers[RESTARTED], 600.0)
        catchup = servers[RESTARTED].call(lambda: servers[RESTARTED].shard.membership.catchup)
        state["phase"] = "after"
        servers[PARTNER].stop(0)  # the other keeper of the roots shard 1 owns
        time.sleep(bench.steady_seconds)
    finally:
        stop.set()
        worker.join()
    roots = np.concatenate((before_roots, during_roots))
    b = np.concatenate((before_b, during_b))
    keep = len(roots) // 10  # never completed: must not end ACKED
    for lo in range(keep, len(roots), _LOAD_CHUNK):
        part = slice(lo, min(lo + _LOAD_CHUNK, len(roots)))
        client.ack_columns(roots[part], b[part])
    client.flush()
    outcomes.wait_count(len(emitted) + len(roots) - keep, timeout=60.0)
    with outcomes.cond:
        first_seen = dict(outcomes.first)
    completed = list(emitted) + roots[keep:].tolist()
    incomplete = roots[:keep].tolist()
    lost = sum(1 for r in completed if r not in first_seen)
    replayed = sum(1 for r in completed if r in first_seen and first_seen[r][0] != Outcome.ACKED)
    false_acks = sum(1 for r in incomplete if r in first_seen and first_seen[r][0] == Outcome.ACKED)

    def p99(which: str) -> float | None:
        lat = [(first_seen[r][1] - t) * 1000 for r, t in emitted.items() if phase[r] == which and r in first_seen]
        return round(float(np.percentile(lat, 99)), 2) if lat else None

    outcomes.close()
    client.close()
    held = caught_up_at - restarted_at
    return {
        "mode": "catchup",
        "engine": bench.engine,
        "pending_trees": bench.pending_trees,
        "moved_trees": catchup.copied_trees,
        "moved_entries": catchup.copied_entries,
        "catchup_seconds": round(max(0.0, held - bench.catchup_delay), 3),
        "held_seconds": round(held, 3),
        "catchup_delay": bench.catchup_delay,
        "steady_trees": len(emitted),
        "lost": lost,
        "replayed": replayed,
        "false_acks": false_acks,
        "p99_ms_steady": p99("steady"),
        "p99_ms_catching_up": p99("catching-up"),
        "p99_ms_after": p99("after"),
    }
