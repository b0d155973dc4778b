"""acker-bench: drive an acker cluster with synthetic tuple trees and report throughput, latency and server cost."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass

import numpy as np
from acker_client import AckerError, ClusterClient
from acker_cluster import ClusterError
from acker_protocol.credentials import ChannelSecurity

from .apply import ApplyBenchConfig, measure_pending_bytes, run_apply_bench
from .ledger import run_ledger_bench
from .mass_timeout import run_mass_timeout

__all__ = ["main", "BenchConfig", "run_bench"]


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


def _rss_from_metrics(url: str) -> int | None:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode("utf-8")
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "process_resident_memory_bytes":
                return int(sample.value)
    return None


def _server_cpu(cluster) -> list[float] | None:
    """CPU seconds (user + system) each embedded acker process has used so far, or None."""
    if cluster is None:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = []
    for i in range(cluster.count):
        try:
            with open(f"/proc/{cluster.pid(i)}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            return None
        seconds.append((int(fields[11]) + int(fields[12])) / ticks)  # utime, stime
    return seconds


def _add_server_cpu(result: dict, before: list[float] | None, after: list[float] | None) -> None:
    """Add the ackers' CPU use: ops per acker CPU-second says what one acker does on a core of its own,
    however busy the machine (the load generator shares it)."""
    if before is None or after is None:
        return
    used = [a - b for a, b in zip(after, before)]
    result["server_cpu_seconds"] = [round(u, 3) for u in used]
    ops = result["apply_ops_per_s"] * result["duration_s"]
    result["apply_ops_per_server_cpu_s"] = round(ops / sum(used), 1) if sum(used) else None


def _rss_from_proc(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="acker-bench",
        description="Drive an acker cluster with synthetic tuple trees; print ack ops/s, trees/s, outcome "
        "latency (last ack sent -> spout callback), server pending trees and RSS.",
    )
    p.add_argument("--ackers", help="host:port,... of a running cluster in shard order (default: embedded)")
    p.add_argument("--metrics-urls", help="comma-separated /metrics URLs of --ackers, for their RSS")
    p.add_argument(
        "--embedded-ackers", type=int, default=1, help="acker processes to start when --ackers is not given (default 1)"
    )
    p.add_argument("--message-timeout", type=float, default=30.0, help="embedded ackers' timeout (default 30)")
    p.add_argument("--fan-out", type=int, default=2, help="children per tuple (default 2)")
    p.add_argument("--depth", type=int, default=2, help="levels below the spout tuple (default 2)")
    p.add_argument("--batch-size", type=int, default=512, help="client batch size (default 512)")
    p.add_argument("--flush-interval", type=float, default=0.002, help="client flush age in s (default 0.002)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load (default 10)")
    p.add_argument("--processes", type=int, default=1, help="client processes (default 1)")
    p.add_argument("--max-pending", type=int, default=5_000, help="spout max pending per process")
    p.add_argument(
        "--mode",
        choices=("trees", "apply", "memory", "ledger", "mass-timeout"),
        default="trees",
        help="trees: Python spout and bolts end to end (default); apply: raw batched Apply "
        "throughput into the ackers; memory: acker RSS per pending tree (one embedded acker per engine); "
        "ledger: the ledger alone in this process, native against reference; "
        "mass-timeout: --trees trees expire at once while health checks and Apply are timed",
    )
    p.add_argument(
        "--engine",
        choices=("native", "reference"),
        default="native",
        help="ledger engine of the embedded ackers (default native); memory mode measures both",
    )
    p.add_argument(
        "--trees",
        type=int,
        default=1_000_000,
        help="ledger mode: trees sent through; mass-timeout mode: trees expiring at once (default 1M)",
    )
    p.add_argument("--batch-ops", type=int, default=8192, help="apply mode: operations per Apply call")
    p.add_argument(
        "--pending-trees",
        type=int,
        default=1_000_000,
        help="memory mode: trees left pending; ledger mode: trees pending in the background of a second run (default 1M)",
    )
    p.add_argument(
        "--keyed-acks",
        type=int,
        default=0,
        help="memory mode: non-completing ACKs per tree, each with its own dedup key (a client batch key's cost)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--tls-ca", help="--ackers serve TLS: PEM CA that signed their certificates")
    p.add_argument("--tls-cert", help="client certificate for ackers that require mutual TLS")
    p.add_argument("--tls-key", help="key of --tls-cert")
    p.add_argument("--token-file", help="file holding a bearer token for ackers with --auth-tokens")
    p.add_argument("--server-name", help="name to check the ackers' certificates against")
    p.add_argument(
        "--compare-tls",
        action="store_true",
        help="apply mode: run the same load into embedded plaintext and TLS ackers, alternating, and report both",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Console entry point: a run, or one line on stderr saying why it could not run (exit 1)."""
    args = _parser().parse_args(argv)
    try:
        return _main(args)
    except (AckerError, ClusterError, OSError, ValueError) as err:
        print(f"acker-bench: {getattr(err, 'headline', err)}", file=sys.stderr)  # ClusterError: one line
        return 1


def _main(args: argparse.Namespace) -> int:
    if args.fan_out < 1 or args.depth < 0 or args.processes < 1 or args.duration <= 0:
        print("acker-bench: --fan-out and --processes must be >= 1, --depth >= 0, --duration > 0", file=sys.stderr)
        return 2
    if args.mode == "memory":
        return _memory_mode(args)
    if args.mode == "ledger":
        return _ledger_mode(args)
    if args.mode == "mass-timeout":
        return _mass_timeout_mode(args)
    if args.compare_tls:
        return _compare_tls_mode(args)
    security = None
    if args.tls_ca or args.tls_cert:
        security = ChannelSecurity(
            tls=True, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
            token_file=args.token_file, server_name=args.server_name,
        )  # fmt: skip
    cluster = None
    if args.ackers:
        addresses = tuple(a for a in args.ackers.split(",") if a)
        metrics_urls = [u for u in (args.metrics_urls or "").split(",") if u]
        # Checked here, before any worker process starts: a wrong address list is one
        # clear error, not a traceback per process.
        ClusterClient(addresses, security=security).close()
    else:
        from acker_cluster import ProcessCluster

        cluster = ProcessCluster(
            count=args.embedded_ackers,
            metrics_base_port=0,
            message_timeout=args.message_timeout,
            extra_args=("--engine", args.engine),
        ).start()
        addresses, metrics_urls = tuple(cluster.addresses), list(cluster.metrics_urls or [])
    try:
        if args.mode == "apply":
            cpu_before = _server_cpu(cluster)
            result = run_apply_bench(ApplyBenchConfig(
                addresses=addresses, batch_ops=args.batch_ops, duration=args.duration, processes=args.processes,
                security=security,
            ))  # fmt: skip
            _add_server_cpu(result, cpu_before, _server_cpu(cluster))
        else:
            result = run_bench(BenchConfig(
                addresses=addresses, fan_out=args.fan_out, depth=args.depth, batch_size=args.batch_size,
                flush_interval=args.flush_interval, duration=args.duration, processes=args.processes,
                max_pending=args.max_pending, security=security,
            ))  # fmt: skip
        result["server_rss_bytes"] = _server_rss(cluster, metrics_urls)
        if cluster is not None:
            result["engine"] = args.engine
    finally:
        if cluster is not None:
            cluster.stop()
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0


def _compare_tls_mode(args: argparse.Namespace) -> int:
    """Apply throughput into embedded plaintext and TLS ackers in the same run."""
    from .tls import compare_tls

    if args.mode != "apply" or args.ackers:
        print("acker-bench: --compare-tls runs --mode apply against embedded ackers (no --ackers)", file=sys.stderr)
        return 2
    result = compare_tls(args.embedded_ackers, args.batch_ops, args.duration, args.processes, args.message_timeout)
    if args.json:
        print(json.dumps(result))
    else:
        rows = [
            ("plaintext Apply ops/s", ", ".join(f"{v:,.0f}" for v in result["plaintext_ops_per_s"])),
            ("TLS Apply ops/s", ", ".join(f"{v:,.0f}" for v in result["tls_ops_per_s"])),
            ("TLS overhead (median)", f"{result['tls_overhead_percent']} %"),
        ]
        _print_rows(
            f"acker-bench --mode apply --compare-tls: {result['ackers']} acker(s), {result['rounds']} rounds", rows
        )
    return 0


def _memory_mode(args: argparse.Namespace) -> int:
    """Leave --pending-trees trees pending on a fresh embedded acker per engine; RSS per tree, both in one run."""
    result: dict = {"mode": "memory", "engine": "native"}
    for engine in ("native", "reference"):
        figures = _pending_bytes(engine, args.pending_trees, args.keyed_acks)
        prefix = "" if engine == "native" else "reference_"
        result.update({prefix + k: v for k, v in figures.items()})
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            "acker-bench: acker memory per pending tree", [(k.replace("_", " "), f"{v:,}") for k, v in result.items()]
        )
    return 0


def _pending_bytes(engine: str, trees: int, keyed_acks: int = 0) -> dict:
    from acker_cluster import ProcessCluster

    # A long timeout keeps every tree pending while RSS is read.
    with ProcessCluster(count=1, message_timeout=3600.0, extra_args=("--engine", engine)) as cluster:
        return measure_pending_bytes(
            cluster.addresses[0],
            lambda: _rss_from_proc(cluster.pid(0) or 0) or 0,
            trees=trees,
            keyed_acks=keyed_acks,
        )


def _mass_timeout_mode(args: argparse.Namespace) -> int:
    """--trees trees expire at once on an embedded acker of --engine; worst health-check and Apply latency."""
    result = run_mass_timeout(args.trees, args.engine).summary()
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            f"acker-bench --mode mass-timeout: {result['trees']:,} trees expiring at once, {args.engine} engine",
            [(k.replace("_", " "), f"{v:,}" if isinstance(v, (int, float)) else str(v)) for k, v in result.items()],
        )
    return 0 if result["outcomes_delivered"] == result["trees"] else 1


def _ledger_mode(args: argparse.Namespace) -> int:
    """The ledger alone, in this process: native (columnar and request paths) against the reference."""
    result = run_ledger_bench(trees=args.trees, batch_ops=args.batch_ops, background=args.pending_trees)
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            f"acker-bench --mode ledger: {result['trees']:,} trees, {result['batch_ops']:,} ops per batch",
            [(k.replace("_", " "), f"{v:,}" if isinstance(v, (int, float)) else str(v)) for k, v in result.items()],
        )
    return 0


def _server_rss(cluster, metrics_urls: list[str]) -> list[int | None]:
    if metrics_urls:
        return [_rss_from_metrics(u) for u in metrics_urls]
    if cluster is not None:
        return [_rss_from_proc(cluster.pid(i)) if cluster.pid(i) else None for i in range(cluster.count)]
    return []


def _print_rows(title: str, rows: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)


def _print_table(result: dict) -> None:
    rss = ", ".join(f"{r / 2**20:.1f} MiB" if r else "?" for r in result["server_rss_bytes"]) or "unknown"
    if result.get("mode") == "apply":
        _print_rows(
            f"acker-bench --mode apply: {result['ackers']} acker(s), {result['processes']} client process(es), "
            f"{result['batch_ops']} ops per call",
            [
                ("Apply ops/s", f"{result['apply_ops_per_s']:,.0f}"),
                ("trees/s", f"{result['trees_per_s']:,.0f}"),
                ("Apply calls", f"{result['calls']:,}"),
                ("outcomes streamed / trees sent", f"{result['outcomes_streamed']:,} / {result['trees_sent']:,}"),
                ("Apply latency p50 / p99", f"{result['apply_p50_ms']} / {result['apply_p99_ms']} ms"),
                ("Apply ops per acker CPU-second", f"{result.get('apply_ops_per_server_cpu_s') or 0:,.0f}"),
                ("server RSS per acker", rss),
                ("duration", f"{result['duration_s']} s"),
            ],
        )
        return
    title = (
        f"acker-bench: {result['ackers']} acker(s), {result['processes']} client process(es), "
        f"fan-out {result['fan_out']}, depth {result['depth']}, batch {result['batch_size']}"
    )
    rows = [
        ("ack ops/s", f"{result['ack_ops_per_s']:,.0f}"),
        ("trees/s", f"{result['trees_per_s']:,.0f}"),
        ("outcome latency p50", f"{result['outcome_p50_ms']} ms"),
        ("outcome latency p99", f"{result['outcome_p99_ms']} ms"),
        ("trees acked / failed", f"{result['trees_acked']:,} / {result['trees_failed']:,}"),
        ("server pending trees (max sampled)", f"{result['server_pending_trees_max']:,}"),
        ("server RSS per acker", rss),
        ("duration", f"{result['duration_s']} s"),
    ]
    _print_rows(title, rows)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
