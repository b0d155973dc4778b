"""acker-bench --mode apply --compare-replicas: what keeping every tree on two ackers costs, in one run.

Two embedded clusters of the same size are started, one with ``--replicas 1``
and one with ``--replicas 2``. The apply benchmark alternates between them for
``rounds`` rounds (so drift in the machine's load hits both alike) and reports
distinct trees per second and Apply latency for each; then ``pending_trees``
trees are left pending on each cluster and the growth of the ackers' summed
resident memory per tree is the memory cost (a replicated tree is held twice).
"""

from __future__ import annotations

import secrets
import statistics

import numpy as np

from .apply import ApplyBenchConfig, _trees_request, run_apply_bench

__all__ = ["compare_replicas", "cluster_bytes_per_pending_tree"]

_BATCH = 8192


def cluster_bytes_per_pending_tree(cluster, replicas: int, trees: int, rss_of) -> float | None:
    """Leave ``trees`` trees pending on ``cluster`` (each on its ``replicas`` shards); summed RSS growth per tree.

    ``rss_of(pid)`` reads one acker's resident set size in bytes.
    """
    import grpc
    from acker_protocol import grpc_options
    from acker_protocol.v1 import acker_pb2_grpc

    n = cluster.count
    rng = np.random.default_rng(secrets.randbits(64))
    channels = [grpc.insecure_channel(a, options=grpc_options.client_options()) for a in cluster.addresses]
    try:
        stubs = [acker_pb2_grpc.AckerStub(ch) for ch in channels]
        before = sum(rss_of(cluster.pid(i)) or 0 for i in range(n))
        for start in range(0, trees, _BATCH):
            count = min(_BATCH, trees - start)
            shard = (start // _BATCH) % n
            request = _trees_request(rng, count, shard, n, ack=False)
            for k in range(replicas):
                stubs[(shard + k) % n].Apply(request, timeout=30)
        after = sum(rss_of(cluster.pid(i)) or 0 for i in range(n))
    finally:
        for ch in channels:
            ch.close()
    return round((after - before) / trees, 1) if trees else None


def compare_replicas(
    ackers: int,
    batch_ops: int,
    duration: float,
    processes: int,
    engine: str,
    rss_of,
    rounds: int = 2,
    pending_trees: int = 200_000,
) -> dict:
    """Trees/s, Apply p50/p99 and cluster bytes per pending tree with replicas 1 and 2, and the cost ratios."""
    from acker_service.process_cluster import ProcessCluster

    if ackers < 2:
        raise ValueError("--compare-replicas needs at least 2 embedded ackers (a tree's copies on different ackers)")
    clusters = {
        r: ProcessCluster(count=ackers, message_timeout=3600.0, extra_args=("--engine", engine, "--replicas", str(r)))
        for r in (1, 2)
    }
    runs: dict[int, list[dict]] = {1: [], 2: []}
    with clusters[1], clusters[2]:
        for _ in range(rounds):
            for r, cluster in clusters.items():
                runs[r].append(run_apply_bench(ApplyBenchConfig(
                    addresses=tuple(cluster.addresses), batch_ops=batch_ops, duration=duration,
                    processes=processes, replicas=r,
                )))  # fmt: skip
        memory = {r: cluster_bytes_per_pending_tree(c, r, pending_trees, rss_of) for r, c in clusters.items()}
    result: dict = {"mode": "apply-compare-replicas", "ackers": ackers, "processes": processes, "engine": engine}
    result.update({"batch_ops": batch_ops, "rounds": rounds, "pending_trees": pending_trees})
    for r in (1, 2):
        result[f"replicas{r}_trees_per_s"] = round(statistics.median(x["trees_per_s"] for x in runs[r]), 1)
        result[f"replicas{r}_apply_p50_ms"] = round(statistics.median(x["apply_p50_ms"] or 0 for x in runs[r]), 3)
        result[f"replicas{r}_apply_p99_ms"] = round(statistics.median(x["apply_p99_ms"] or 0 for x in runs[r]), 3)
        result[f"replicas{r}_cluster_bytes_per_pending_tree"] = memory[r]
    one, two = result["replicas1_trees_per_s"], result["replicas2_trees_per_s"]
    result["throughput_cost_percent"] = round(100 * (one - two) / one, 1) if one else None
    if memory[1] and memory[2]:
        result["memory_ratio"] = round(memory[2] / memory[1], 2)
    return result
