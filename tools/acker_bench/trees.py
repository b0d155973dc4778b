"""acker-bench's trees mode: client processes start synthetic tuple trees, ack them, and time their outcomes.

Each tree is one spout tuple with ``depth`` levels below it and ``fan_out``
children per tuple, so ``1 + f + ... + f^d`` acks per tree. Two flavours of
load generator (``api``):

- ``tuples``: Storm-style, one Python object per tuple: ``Spout.emit`` per
  tree, ``BoltCollector.emit``/``ack`` per tuple, the spout's ``on_ack`` per
  outcome. The per-tuple cost of the client API.
- ``columns``: what a columnar user does: a batch of trees at a time, started
  with the bulk spout's ``Spout.emit_columns`` (admission under
  ``max_pending``, the backstop, one ``init_columns``) and acked with one
  ``ack_columns`` call per level, edge ids drawn with numpy, outcomes through
  the spout's ``on_outcomes`` a batch at a time (:mod:`acker_bench.columns_load`).
  The cost of the client's machinery and the ackers, not of per-tuple objects.

Outcome latency is measured from the moment the tree's last ack call starts to
the moment its outcome reaches the spout's callback (``on_ack`` or
``on_outcomes``). ``rate`` paces the trees
(:class:`Pacer`) so that latency can be read at a fixed load, e.g. half the
capacity an unpaced run reports.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from acker_protocol.credentials import ChannelSecurity

__all__ = ["APIS", "BenchConfig", "Pacer", "run_bench", "find_capacity", "load_points", "summarize"]

APIS = ("tuples", "columns")


@dataclass(frozen=True)
class BenchConfig:
    """What to run: cluster, tree shape, client batching, duration, client processes, API flavour and pace."""

    addresses: tuple[str, ...]
    fan_out: int = 2
    depth: int = 2
    batch_size: int = 512
    flush_interval: float = 0.002
    duration: float = 10.0
    processes: int = 1
    max_pending: int = 5_000
    security: ChannelSecurity | None = None
    api: str = "tuples"
    rate: float | None = None  # trees/s for the whole run, split evenly over the processes; None: flat out
    tick: float = 0.002  # paced: seconds between the load's batches (Pacer); 0: whatever is due, at once
    chunk: int = 1_024  # columns: most trees started per batch (a paced batch is usually far smaller)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, not {self.api!r}")
        if self.fan_out < 1 or self.depth < 0 or self.processes < 1 or self.duration <= 0:
            raise ValueError("fan_out and processes must be >= 1, depth >= 0 and duration > 0")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a positive number of trees per second, got {self.rate}")
        if self.chunk < 1 or self.max_pending < 1:
            raise ValueError("chunk and max_pending must be >= 1")
        if not (self.tick >= 0 and math.isfinite(self.tick)):
            raise ValueError(f"tick must be zero or a positive number of seconds, got {self.tick}")

    @property
    def acks_per_tree(self) -> int:
        """Ack calls per tree: one per tuple, ``1 + f + ... + f^d``."""
        return sum(self.fan_out**level for level in range(self.depth + 1))


class Pacer:
    """Says how many trees are due, for a steady ``rate`` per second, in batches of at most ``max_batch``.

    Trees are due on a fixed schedule from the first call: by time ``t``,
    ``floor(t * rate)`` trees. A generator that falls behind gets the backlog
    in batches of ``max_batch`` (so its achieved rate shows the shortfall);
    ``rate=None`` means no pacing: every call gets ``max_batch``.

    ``tick`` (seconds) makes :meth:`take` wait until a tick's worth of trees
    is due (``rate * tick``, at least 1, at most ``max_batch``), as a producer
    of batches would. Without it a generator whose batch costs more than the
    gap between two trees never sleeps: it spins on batches of one or two
    trees and takes a whole core from the client's threads and the ackers it
    is measuring (docs/benchmarks.md). ``clock`` and ``sleep`` are injectable
    for tests.
    """

    def __init__(
        self,
        rate: float | None,
        max_batch: int,
        *,
        tick: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be positive, got {rate}")
        if not (tick >= 0 and math.isfinite(tick)):
            raise ValueError(f"tick must be zero or a positive number of seconds, got {tick}")
        self.rate = rate
        self.max_batch = max_batch
        # Trees take() waits for: a tick's worth (the fraction of a tree below one is dropped).
        self.min_batch = 1 if rate is None else min(max_batch, max(1, math.floor(rate * tick + 1e-6)))
        self._clock = clock
        self._sleep = sleep
        self.started_at: float | None = None
        self.issued = 0

    def due(self) -> int:
        """Trees due now and not yet handed out (capped at ``max_batch``); counts them as handed out."""
        if self.started_at is None:
            self.started_at = self._clock()
        if self.rate is None:
            count = self.max_batch
        else:
            # The first tree is due at once; the epsilon (a millionth of a tree) keeps a
            # float product such as 10.999999 from missing the tree that wait() slept for.
            scheduled = math.floor((self._clock() - self.started_at) * self.rate + 1e-6) + 1
            count = min(max(scheduled - self.issued, 0), self.max_batch)
        self.issued += count
        return count

    def wait(self) -> None:
        """Sleep until ``min_batch`` trees are due (at once when unpaced or behind)."""
        if self.rate is None or self.started_at is None:
            return
        # Tree k (from 0) is due at k / rate.
        next_at = self.started_at + (self.issued + self.min_batch - 1) / self.rate
        pause = next_at - self._clock()
        if pause > 0:
            self._sleep(pause)

    def take(self) -> int:
        """Wait until ``min_batch`` trees are due (the first call: one, at once), then return how many are (>= 1)."""
        self.wait()
        while True:
            count = self.due()
            if count:
                return count
            self.wait()


def summarize(config: BenchConfig, parts: list[dict], sampled_pending: list[int]) -> dict:
    """The run's JSON figures from each client process's counts and latency arrays."""
    lat = np.concatenate([p["latencies"] for p in parts]) if parts else np.zeros(0)
    elapsed = max(p["elapsed"] for p in parts)
    load = max(p["load_seconds"] for p in parts)
    started = sum(p["started"] for p in parts)
    acked = sum(p["trees"] for p in parts)

    def ms(q: float) -> float | None:
        return round(float(np.percentile(lat, q)) * 1e3, 3) if lat.size else None

    return {
        "mode": "trees",
        "api": config.api,
        "ackers": len(config.addresses),
        "processes": config.processes,
        "fan_out": config.fan_out,
        "depth": config.depth,
        "batch_size": config.batch_size,
        "rate_requested": config.rate,
        "tick_s": config.tick if config.rate is not None else None,
        "duration_s": round(elapsed, 3),
        "load_seconds": round(load, 3),
        "ack_ops_per_s": round(sum(p["acks"] for p in parts) / elapsed, 1),
        "trees_per_s": round(acked / elapsed, 1),
        "trees_started_per_s": round(started / load, 1),
        "trees_started": int(started),
        "trees_acked": int(acked),
        "trees_failed": int(sum(p["failed"] for p in parts)),
        "trees_unfinished": int(started - acked - sum(p["failed"] for p in parts)),
        "operations_sent": int(sum(p.get("operations_sent", 0) for p in parts)),
        "outcome_p50_ms": ms(50),
        "outcome_p99_ms": ms(99),
        "outcome_max_ms": round(float(lat.max()) * 1e3, 3) if lat.size else None,
        "server_pending_trees_max": max(sampled_pending, default=0),
    }


def _wait_for_start(start_at: float) -> None:
    while time.time() < start_at:
        time.sleep(0.001)


def _client(config: BenchConfig):
    from acker_client import ClusterClient

    return ClusterClient(
        config.addresses, batch_size=config.batch_size, flush_interval=config.flush_interval, security=config.security
    )


def _per_process_rate(config: BenchConfig) -> float | None:
    return None if config.rate is None else config.rate / config.processes


def _tuples_worker(config: BenchConfig, worker: int, start_at: float, results) -> None:
    """One client process, Storm-style: Spout.emit per tree, BoltCollector.emit/ack per tuple."""
    from acker_client import BoltCollector, Spout

    latencies: list[float] = []
    last_ack: dict[int, float] = {}  # tree -> when its last ack call started

    def on_ack(tree: int) -> None:
        now = time.perf_counter()
        sent = last_ack.pop(tree, None)  # dict operations are atomic: no lock needed
        if sent is not None:
            latencies.append(now - sent)

    def on_fail(tree: int, reason) -> None:
        last_ack.pop(tree, None)

    with _client(config) as client:
        spout = Spout(client, on_ack=on_ack, on_fail=on_fail, max_pending=config.max_pending).start()
        bolt = BoltCollector(client)
        pacer = Pacer(_per_process_rate(config), 64, tick=config.tick)
        fan_out, depth = config.fan_out, config.depth
        _wait_for_start(start_at)
        began = time.perf_counter()
        end = began + config.duration
        acks = trees = 0
        while time.perf_counter() < end:
            for _ in range(pacer.take()):
                level = [spout.emit(trees, trees)]
                for _ in range(depth):
                    children: list = []
                    for parent in level:
                        children.extend([bolt.emit(None, parent) for _ in range(fan_out)])
                        bolt.ack(parent)
                    acks += len(level)
                    level = children
                for leaf in level[:-1]:
                    bolt.ack(leaf)
                last_ack[trees] = time.perf_counter()
                bolt.ack(level[-1])
                acks += len(level)
                trees += 1
        counts = _drain(client, spout, began)
    results.put({**counts, "acks": acks, "started": trees, "latencies": np.asarray(latencies, dtype=np.float64)})


def _drain(client: Any, spout: Any, began: float) -> dict[str, Any]:
    """End a worker's load: flush, wait for every outcome, close the spout; the worker's counts and times."""
    load_seconds = time.perf_counter() - began
    client.flush()
    spout.wait_idle(60)
    elapsed = time.perf_counter() - began
    stats = spout.stats
    spout.close()
    return {
        "trees": stats.acked,
        "failed": stats.failed + stats.timed_out + stats.lost,
        "elapsed": elapsed,
        "load_seconds": load_seconds,
        "operations_sent": client.stats.operations_sent,
    }


def _columns_worker(config: BenchConfig, worker: int, start_at: float, results) -> None:
    """One client process, columnar: batches of trees through Spout.emit_columns / ack_columns, on_outcomes."""
    from acker_client import Spout, SpoutFull

    from .columns_load import ColumnTrees

    trees = ColumnTrees(config.fan_out, config.depth)
    latencies: list[np.ndarray] = []  # appended on the spout's callback thread, read after wait_idle

    def on_outcomes(acked: list, failed: list) -> None:
        if acked:
            latencies.append(trees.latencies(acked, time.perf_counter()))

    with _client(config) as client:
        spout = Spout(client, on_outcomes=on_outcomes, max_pending=config.max_pending).start()
        # A batch never exceeds max_pending, so back-pressure can always admit one.
        pacer = Pacer(_per_process_rate(config), min(config.chunk, config.max_pending), tick=config.tick)
        _wait_for_start(start_at)
        began = time.perf_counter()
        end = began + config.duration
        acks = started = 0
        while time.perf_counter() < end:
            count = pacer.take()
            try:
                # The spout's max_pending is the back-pressure: wait for outcomes, but not past the load's end.
                acks += trees.run_batch(spout, client, count, timeout=max(end - time.perf_counter(), 0.001))
            except SpoutFull:
                break
            started += count
        counts = _drain(client, spout, began)
    merged = np.concatenate(latencies) if latencies else np.zeros(0)
    results.put({**counts, "acks": acks, "started": started, "latencies": merged})


def run_bench(config: BenchConfig) -> dict:
    """Run the client processes against ``config.addresses`` and return the merged figures."""
    ctx = multiprocessing.get_context("spawn")  # a clean interpreter per client: no inherited gRPC state
    results = ctx.Queue()
    start_at = time.time() + 2.0 + 0.5 * config.processes  # let every process import and connect first
    target = _columns_worker if config.api == "columns" else _tuples_worker
    procs = [ctx.Process(target=target, args=(config, i, start_at, results)) for i in range(config.processes)]
    for p in procs:
        p.start()
    sampled_pending = _sample_pending(config, start_at, procs)
    parts = [results.get(timeout=config.duration + 180) for _ in procs]
    for p in procs:
        p.join()
    return summarize(config, parts, sampled_pending)


def find_capacity(config: BenchConfig, fraction: float = 0.5) -> dict:
    """Measure the capacity flat out, then run again paced at ``fraction`` of it: that run's figures.

    The result holds the paced run's figures plus ``capacity_trees_per_s``
    (the flat-out run's trees/s) and ``capacity_run`` (its full figures).
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    flat_out = run_bench(replace(config, rate=None))
    capacity = flat_out["trees_per_s"]
    if not capacity:
        raise RuntimeError("the flat-out run completed no tree: no capacity to pace against")
    paced = run_bench(replace(config, rate=capacity * fraction))
    return {**paced, "capacity_trees_per_s": capacity, "capacity_fraction": fraction, "capacity_run": flat_out}


def load_points(config: BenchConfig, loads: Sequence[float]) -> dict:
    """Measure the capacity flat out, then run paced at each fraction of it in ``loads``: latency by load.

    The result is the flat-out run's figures plus ``capacity_trees_per_s`` and
    ``points``: one ``{load, trees_per_s, p50_ms, p99_ms}`` per load, in the
    order given, so a latency that grows as the load falls shows at a glance.
    """
    if not loads or not all(0 < load <= 1 for load in loads):
        raise ValueError(f"load points must be fractions in (0, 1], got {list(loads)}")
    flat_out = run_bench(replace(config, rate=None))
    capacity = flat_out["trees_per_s"]
    if not capacity:
        raise RuntimeError("the flat-out run completed no tree: no capacity to pace against")
    points = []
    for load in loads:
        paced = run_bench(replace(config, rate=capacity * load))
        points.append(
            {
                "load": load,
                "trees_per_s": paced["trees_per_s"],
                "p50_ms": paced["outcome_p50_ms"],
                "p99_ms": paced["outcome_p99_ms"],
            }
        )
    return {**flat_out, "capacity_trees_per_s": capacity, "points": points}


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
