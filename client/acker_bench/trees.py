"""acker-bench's trees mode: client processes run a spout and bolts building synthetic tuple trees end to end."""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass

import numpy as np
from acker_protocol.credentials import ChannelSecurity

__all__ = ["BenchConfig", "run_bench"]


@dataclass(frozen=True)
class BenchConfig:
    """What to run: cluster, tree shape, client batching, duration and client processes."""

    addresses: tuple[str, ...]
    fan_out: int = 2
    depth: int = 2
    batch_size: int = 512
    flush_interval: float = 0.002
    duration: float = 10.0
    processes: int = 1
    max_pending: int = 5_000
    security: ChannelSecurity | None = None


def _run_worker(config: BenchConfig, start_at: float, results) -> None:
    """One client process: spout + bolts in a loop for ``duration`` seconds; puts its counts on ``results``."""
    from acker_client import BoltCollector, ClusterClient, Spout

    latencies: list[float] = []
    last_ack: dict[int, float] = {}
    lock = threading.Lock()

    def on_ack(tree: int) -> None:
        now = time.perf_counter()
        with lock:
            sent = last_ack.pop(tree, None)
        if sent is not None:
            latencies.append(now - sent)

    def on_fail(tree: int, reason) -> None:
        with lock:
            last_ack.pop(tree, None)

    with ClusterClient(
        config.addresses,
        batch_size=config.batch_size,
        flush_interval=config.flush_interval,
        security=config.security,
    ) as client:
        spout = Spout(client, on_ack=on_ack, on_fail=on_fail, max_pending=config.max_pending).start()
        bolt = BoltCollector(client)
        while time.time() < start_at:
            time.sleep(0.001)
        began = time.perf_counter()
        end = began + config.duration
        acks = trees = 0
        while time.perf_counter() < end:
            level = [spout.emit(trees, trees)]
            for _ in range(config.depth):
                children: list = []
                for parent in level:
                    children.extend(bolt.emit(None, [parent]) for _ in range(config.fan_out))
                    bolt.ack(parent)
                acks += len(level)
                level = children
            with lock:
                for leaf in level[:-1]:
                    bolt.ack(leaf)
                bolt.ack(level[-1])
                last_ack[trees] = time.perf_counter()
            acks += len(level)
            trees += 1
        client.flush()
        spout.wait_idle(60)
        elapsed = time.perf_counter() - began
        stats = spout.stats
        spout.close()
    results.put(
        {
            "acks": acks,
            "trees": stats.acked,
            "failed": stats.failed + stats.timed_out + stats.lost,
            "elapsed": elapsed,
            "latencies": np.asarray(latencies, dtype=np.float64),
        }
    )


def run_bench(config: BenchConfig) -> dict:
    """Run the client processes against ``config.addresses`` and return the merged figures."""
    ctx = multiprocessing.get_context("spawn")  # a clean interpreter per client: no inherited gRPC state
    results = ctx.Queue()
    start_at = time.time() + 2.0 + 0.5 * config.processes  # let every process import and connect first
    procs = [ctx.Process(target=_run_worker, args=(config, start_at, results)) for _ in range(config.processes)]
    for p in procs:
        p.start()
    sampled_pending = _sample_pending(config, start_at, procs)
    parts = [results.get(timeout=config.duration + 180) for _ in procs]
    for p in procs:
        p.join()
    lat = np.concatenate([p["latencies"] for p in parts]) if parts else np.zeros(0)
    elapsed = max(p["elapsed"] for p in parts)
    return {
        "ackers": len(config.addresses),
        "processes": config.processes,
        "fan_out": config.fan_out,
        "depth": config.depth,
        "batch_size": config.batch_size,
        "duration_s": round(elapsed, 3),
        "ack_ops_per_s": round(sum(p["acks"] for p in parts) / elapsed, 1),
        "trees_per_s": round(sum(p["trees"] for p in parts) / elapsed, 1),
        "trees_acked": int(sum(p["trees"] for p in parts)),
        "trees_failed": int(sum(p["failed"] for p in parts)),
        "outcome_p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 3) if lat.size else None,
        "outcome_p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 3) if lat.size else None,
        "server_pending_trees_max": max(sampled_pending, default=0),
    }


def _sample_pending(config: BenchConfig, start_at: float, procs) -> list[int]:
    """Sum of the ackers' pending trees (Describe), sampled every 0.5 s while the clients run."""
    from acker_client import AckerError, ClusterClient

    samples = []
    with ClusterClient(config.addresses, security=config.security) as client:
        while time.time() < start_at:
            time.sleep(0.05)
        while any(p.is_alive() for p in procs) and time.time() < start_at + config.duration:
            try:
                samples.append(sum(client.describe(i).pending_trees for i in range(client.shard_count)))
            except AckerError:
                pass
            time.sleep(0.5)
    return samples
