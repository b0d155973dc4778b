"""acker-bench --mode apply: raw batched throughput into the ackers, and server bytes per pending tree.

The tree mode (``cli.py``) measures what a Python pipeline gets end to end and
is bound by the load generator. This mode measures the ackers themselves: each
client process sends pre-encoded Apply batches of fresh trees (half INIT, half
ACK, so every tree ends ACKED and its outcome is streamed back), one call in
flight per process, spread round-robin over the shards. The request bytes are
built before the clock starts and cycled (a tree ends within its own batch, so
sending the same bytes again starts and ends the same trees anew); each call's
latency is recorded for the p50/p99. With ``replicas`` 2 (ackers started with
``--replicas 2``) each batch also goes to the next shard, which follows its
roots, both calls in flight at once as the client sends them: a tree costs two
Applies' worth of acker work, and the latency is that of the slower copy.

With ``transport="stream"`` (the default) the batches go over one ApplyStream
per shard and process instead, ``in_flight`` of them outstanding per process
(each copy counts), as a ClusterClient with the stream pipelines them; the
latency is each batch's, from its write to its ack. ``transport="unary"``
is the Apply call per batch described above, for comparison.
"""

from __future__ import annotations

import multiprocessing
import secrets
import threading
import time
from dataclasses import dataclass

import numpy as np
from acker_protocol.credentials import ChannelSecurity

__all__ = ["ApplyBenchConfig", "run_apply_bench", "measure_pending_bytes"]

_SPOUT = "acker-bench-apply"
_POOL = 8  # distinct pre-encoded requests per shard and process


@dataclass(frozen=True)
class ApplyBenchConfig:
    """Cluster, operations per Apply call, duration and client processes."""

    addresses: tuple[str, ...]
    batch_ops: int = 8192
    duration: float = 10.0
    processes: int = 2
    security: ChannelSecurity | None = None  # TLS / token for the channels (None: plaintext)
    replicas: int = 1  # the ackers' --replicas: 2 sends every batch to its shard and the next
    transport: str = "stream"  # "stream": ApplyStream per shard; "unary": one Apply call per batch
    in_flight: int = 4  # stream transport: batches outstanding per process (each replica's copy counts)


def shard_roots(rng: np.random.Generator, count: int, shard: int, shard_count: int) -> np.ndarray:
    """``count`` random non-zero root ids with ``root % shard_count == shard``."""
    roots = rng.integers(1, 2**63, size=count, dtype=np.uint64) // np.uint64(shard_count)
    roots = roots * np.uint64(shard_count) + np.uint64(shard)
    roots[roots == 0] = np.uint64(shard_count)  # only possible on shard 0; shard_count % n == 0 too
    return roots


def _trees_request(rng: np.random.Generator, trees: int, shard: int, shard_count: int, *, ack: bool):
    """An ApplyRequest of ``trees`` fresh INITs, followed by their completing ACKs when ``ack``."""
    from acker_protocol.v1 import acker_pb2

    roots = shard_roots(rng, trees, shard, shard_count).tolist()
    values = rng.integers(1, 2**63, size=trees, dtype=np.uint64).tolist()
    init, ack_kind = acker_pb2.OP_KIND_INIT, acker_pb2.OP_KIND_ACK
    if not ack:
        return acker_pb2.ApplyRequest(kinds=[init] * trees, root_ids=roots, values=values, spouts=[_SPOUT])
    return acker_pb2.ApplyRequest(
        kinds=[init] * trees + [ack_kind] * trees, root_ids=roots + roots, values=values + values, spouts=[_SPOUT]
    )


def _drain(stream, counter: list[int]) -> None:
    """Count streamed outcomes until the stream ends."""
    import grpc

    try:
        for batch in stream:
            counter[0] += len(batch.root_ids)
    except grpc.RpcError:
        pass


def _apply_worker(config: ApplyBenchConfig, start_at: float, results) -> None:
    """One client process: send batches for ``duration`` seconds, report calls and operations."""
    from acker_protocol import grpc_options
    from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

    rng = np.random.default_rng(secrets.randbits(64))
    n = len(config.addresses)
    trees = max(1, config.batch_ops // 2)
    from acker_protocol.credentials import open_channel

    channels = [open_channel(a, config.security, grpc_options.client_options()) for a in config.addresses]
    try:
        applies = [
            ch.unary_unary("/acker_service.v1.Acker/Apply", response_deserializer=acker_pb2.ApplyResponse.FromString)
            for ch in channels
        ]
        streamed = [0]
        streams = [acker_pb2_grpc.AckerStub(ch).Subscribe(acker_pb2.SubscribeRequest(spout=_SPOUT)) for ch in channels]
        drainers = [threading.Thread(target=_drain, args=(s, streamed), daemon=True) for s in streams]
        for t in drainers:
            t.start()
        pool = [
            [_trees_request(rng, trees, shard, n, ack=True).SerializeToString() for _ in range(_POOL)]
            for shard in range(n)
        ]
        latencies = np.zeros(1 << 16, dtype=np.float64)
        while time.time() < start_at:
            time.sleep(0.001)
        if config.transport == "stream":
            ops, calls, elapsed, measured = _stream_load(config, channels, pool, trees, len(latencies))
            _finish(streams, drainers, streamed, results, ops, calls, elapsed, measured)
            return
        ops = calls = 0
        began = time.perf_counter()
        while (sent := time.perf_counter()) - began < config.duration:
            shard = calls % n
            request = pool[shard][(calls // n) % _POOL]
            if config.replicas == 1:
                applies[shard](request, timeout=30)
            else:  # the owner's and the follower's copy at once, as the client sends them
                copies = [applies[(shard + k) % n].future(request, timeout=30) for k in range(config.replicas)]
                for copy in copies:
                    copy.result()
            if calls < len(latencies):
                latencies[calls] = time.perf_counter() - sent
            ops += 2 * trees
            calls += 1
        elapsed = time.perf_counter() - began
        _finish(streams, drainers, streamed, results, ops, calls, elapsed, latencies[: min(calls, len(latencies))])
    finally:
        for ch in channels:
            ch.close()


def _finish(streams, drainers, streamed, results, ops, calls, elapsed, latencies) -> None:
    """Let the last outcomes arrive, stop the outcome streams and report this process's figures."""
    time.sleep(0.5)
    for s in streams:
        s.cancel()
    for t in drainers:
        t.join(5)
    results.put(
        {
            "ops": ops,
            "calls": calls,
            "elapsed": elapsed,
            "streamed": streamed[0],
            "latencies": latencies,
        }
    )


class _BenchStream:
    """One ApplyStream: requests written from a queue, acks read on a thread that frees a slot per ack."""

    def __init__(self, channel, slots: threading.Semaphore, latencies: np.ndarray) -> None:
        import collections
        import queue

        from acker_protocol.v1 import acker_pb2

        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._sent: collections.deque[float] = collections.deque()
        self._slots, self._latencies = slots, latencies
        self.acked = self.refused = 0
        call = channel.stream_stream(
            "/acker_service.v1.Acker/ApplyStream", response_deserializer=acker_pb2.ApplyAck.FromString
        )
        self._call = call(iter(self._queue.get, None))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def send(self, request: bytes) -> None:
        self._sent.append(time.perf_counter())
        self._queue.put(request)

    def _read(self) -> None:
        for ack in self._call:
            latency = time.perf_counter() - self._sent.popleft()
            if self.acked < len(self._latencies):
                self._latencies[self.acked] = latency
            self.acked += 1
            self.refused += bool(ack.code)
            self._slots.release()

    def close(self) -> None:
        self._queue.put(None)
        self._reader.join(30)


def _stream_load(config: ApplyBenchConfig, channels, pool, trees: int, keep: int):
    """Send over one ApplyStream per shard, ``in_flight`` batches outstanding.

    Returns operations, batches, seconds and up to ``keep`` latencies (seconds).
    """
    n = len(channels)
    slots = threading.Semaphore(config.in_flight)
    # Latencies per shard's stream, merged at the end (each reader writes its own array).
    per_stream = [np.zeros(keep // n + 1) for _ in channels]
    streams = [_BenchStream(ch, slots, lat) for ch, lat in zip(channels, per_stream)]
    ops = calls = 0
    began = time.perf_counter()
    while time.perf_counter() - began < config.duration:
        shard = calls % n
        request = pool[shard][(calls // n) % _POOL]
        for k in range(config.replicas):
            slots.acquire()
            streams[(shard + k) % n].send(request)
        ops += 2 * trees
        calls += 1
    for _ in range(config.in_flight):  # every batch acknowledged: the load is done
        slots.acquire()
    elapsed = time.perf_counter() - began
    for stream in streams:
        stream.close()
    if any(stream.refused for stream in streams):
        raise RuntimeError(f"the acker refused {sum(s.refused for s in streams)} benchmark batches")
    measured = np.concatenate([lat[: min(s.acked, len(lat))] for s, lat in zip(streams, per_stream)])
    return ops, calls, elapsed, measured


def run_apply_bench(config: ApplyBenchConfig) -> dict:
    """Run the raw Apply load and return ops/s, trees/s and how many outcomes were streamed back."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + 2.0 + 0.5 * config.processes
    procs = [ctx.Process(target=_apply_worker, args=(config, start_at, results)) for _ in range(config.processes)]
    for p in procs:
        p.start()
    parts = [results.get(timeout=config.duration + 120) for _ in procs]
    for p in procs:
        p.join()
    elapsed = max(p["elapsed"] for p in parts)
    ops = sum(p["ops"] for p in parts)
    lat = np.concatenate([p["latencies"] for p in parts])
    return {
        "mode": "apply",
        "ackers": len(config.addresses),
        "replicas": config.replicas,
        "processes": config.processes,
        "batch_ops": config.batch_ops,
        "transport": config.transport,
        "in_flight": config.in_flight if config.transport == "stream" else 1,
        "duration_s": round(elapsed, 3),
        # Operations the ackers applied (every replica's copy), and distinct trees.
        "apply_ops_per_s": round(ops * config.replicas / elapsed, 1),
        "trees_per_s": round(ops / 2 / elapsed, 1),
        "calls": sum(p["calls"] for p in parts),
        "outcomes_streamed": sum(p["streamed"] for p in parts),
        "trees_sent": ops // 2,
        "apply_p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 3) if lat.size else None,
        "apply_p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 3) if lat.size else None,
    }


def measure_pending_bytes(
    address: str, rss_of, trees: int = 1_000_000, batch: int = 10_000, keyed_acks: int = 0
) -> dict:
    """Init ``trees`` trees on one acker without completing them; RSS growth per pending tree.

    ``rss_of()`` returns the acker's resident set size in bytes. The trees stay
    pending until the acker's timeout, so run it against a fresh acker. With
    ``keyed_acks`` each tree also gets that many non-completing ACKs, each in
    its own request with its own dedup key, as a ClusterClient's batch keys
    would (the cost of the acker's dedup side table).
    """
    import grpc
    from acker_protocol import grpc_options
    from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

    rng = np.random.default_rng(secrets.randbits(64))
    with grpc.insecure_channel(address, options=grpc_options.client_options()) as channel:
        stub = acker_pb2_grpc.AckerStub(channel)
        info = stub.Describe(acker_pb2.DescribeRequest(), timeout=10)
        before_pending, before_rss = info.pending_trees, rss_of()
        for start in range(0, trees, batch):
            count = min(batch, trees - start)
            request = _trees_request(rng, count, info.shard_index, info.shard_count, ack=False)
            stub.Apply(request, timeout=30)
            for _ in range(keyed_acks):
                values = rng.integers(1, 2**63, size=count, dtype=np.uint64).tolist()
                key = secrets.randbits(63) + 1
                ack = acker_pb2.ApplyRequest(
                    kinds=[acker_pb2.OP_KIND_ACK] * count,
                    root_ids=request.root_ids,
                    values=values,
                    dedup_keys=[key] * count,
                )
                stub.Apply(ack, timeout=30)
        after_pending = stub.Describe(acker_pb2.DescribeRequest(), timeout=10).pending_trees
        after_rss = rss_of()
    added = after_pending - before_pending
    return {
        "keyed_acks_per_tree": keyed_acks,
        "pending_trees_added": added,
        "rss_growth_bytes": after_rss - before_rss,
        "bytes_per_pending_tree": round((after_rss - before_rss) / added, 1) if added else None,
    }
