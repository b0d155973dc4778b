"""acker-bench: drive an acker cluster with synthetic tuple trees and report throughput, latency and server cost."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request

from acker_client import AckerError, ClusterClient
from acker_protocol.credentials import ChannelSecurity

from acker_service.process_cluster import ClusterError

from .apply import ApplyBenchConfig, measure_pending_bytes, run_apply_bench
from .ledger import run_ledger_bench
from .mass_timeout import run_mass_timeout
from .simulate import add_simulate_arguments, simulate_mode
from .trees import APIS, BenchConfig, find_capacity, load_points, run_bench

__all__ = ["main", "BenchConfig", "run_bench"]


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
    p.add_argument(
        "--replicas", type=int, default=1, help="embedded ackers' --replicas (1, or 2: every tree on two ackers)"
    )
    p.add_argument(
        "--message-timeout",
        type=float,
        help="embedded ackers' timeout (default 30; pipeline mode 600, so no tree of a 1M-line job times out)",
    )
    p.add_argument("--fan-out", type=int, default=2, help="children per tuple (default 2)")
    p.add_argument("--depth", type=int, default=2, help="levels below the spout tuple (default 2)")
    p.add_argument("--batch-size", type=int, default=512, help="client batch size (default 512)")
    p.add_argument("--flush-interval", type=float, default=0.002, help="client flush age in s (default 0.002)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load (default 10)")
    p.add_argument("--from", dest="from_shards", type=int, default=3, help="reshard mode: ackers before the move")
    p.add_argument("--to", dest="to_shards", type=int, default=4, help="reshard mode: ackers after the move")
    p.add_argument("--back", action="store_true", help="reshard mode: then move back to --from ackers")
    p.add_argument("--processes", type=int, default=1, help="client processes (default 1)")
    p.add_argument("--max-pending", type=int, default=5_000, help="spout max pending per process")
    p.add_argument(
        "--api",
        choices=APIS,
        default="tuples",
        help="trees mode: tuples = Spout.emit and BoltCollector.emit/ack per tuple (Storm-style, default); "
        "columns = batches of trees through the bulk spout (Spout.emit_columns, ack_columns per level, "
        "on_outcomes)",
    )
    p.add_argument(
        "--rate",
        type=float,
        help="trees mode: start this many trees per second in all (split over --processes), paced in small "
        "batches, to read latency at a fixed load (default: flat out)",
    )
    p.add_argument(
        "--tick",
        type=float,
        default=0.002,
        help="trees mode, paced: start the trees due once per this many seconds, a batch at a time as a producer "
        "would (default 0.002; 0: whatever is due, at once, so a load whose batch costs more than the gap "
        "between two trees spins on a core)",
    )
    p.add_argument(
        "--find-capacity",
        action="store_true",
        help="trees mode: run flat out for --duration, then again at --capacity-fraction of the trees/s "
        "reached; report the paced run with capacity_trees_per_s",
    )
    p.add_argument(
        "--load-points",
        help="trees mode: comma-separated fractions of capacity, e.g. 0.1,0.5,0.8: run flat out, then paced at "
        "each; report 'points' (load, trees_per_s, p50_ms, p99_ms)",
    )
    p.add_argument(
        "--capacity-fraction", type=float, default=0.5, help="--find-capacity: the paced run's share (default 0.5)"
    )
    p.add_argument(
        "--chunk", type=int, default=1024, help="trees mode, --api columns: most trees per batch (default 1024)"
    )
    p.add_argument(
        "--mode",
        choices=(
            "trees",
            "apply",
            "memory",
            "ledger",
            "mass-timeout",
            "dataframe",
            "pipeline",
            "exactly-once",
            "simulate",
            "redrive",
            "reshard",
            "catchup",
            "queue",
        ),  # fmt: skip
        default="trees",
        help="trees: Python spout and bolts end to end (default); apply: raw batched Apply "
        "throughput into the ackers; memory: acker RSS per pending tree (one embedded acker per engine); "
        "ledger: the ledger alone in this process, native against reference; "
        "mass-timeout: --trees trees expire at once while health checks and Apply are timed; "
        "dataframe: --records through a 2-stage ArrowBolt pipeline on local Spark, tracked and untracked; "
        "pipeline: --records lines in text files, the plain spark.read job against the tracked SourcePipeline "
        "(alternating --rounds; --sink parquet: the same job writing Parquet, plain df.write against "
        "exactly-once FileOutput); exactly-once: --records through "
        "SourcePipeline into Parquet files and a table while --faults are injected with kill -9, the output "
        "checked row by row; simulate: the seeded simulation of ackers, clients, replicas and handoffs "
        "(--seeds N, or --seed S to replay one with its trace); redrive: --records dead letters redriven "
        "through a SourcePipeline job (--rate caps records/s), each checked to go through exactly once; "
        "reshard: --pending-trees trees moved --from N --to M ackers (and --back) under steady load; "
        "catchup: with --replicas 2, one of 3 ackers restarts with --pending-trees trees pending, copies its "
        "ranges from its partners, then its partner is lost; queue: --messages published to a real --broker "
        "(redis or rabbitmq), drained by SourcePipeline under --faults (broker, driver, acker), each message "
        "checked acked once with its output or dead-lettered, against a plain consumer's messages/s",
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
        "--transport",
        choices=("stream", "unary"),
        default="stream",
        help="apply mode: stream = one ApplyStream per shard and process (default); unary = one Apply call per batch",
    )
    p.add_argument(
        "--in-flight",
        type=int,
        default=4,
        help="apply mode, --transport stream: batches outstanding per process (default 4)",
    )
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
    p.add_argument(
        "--records", type=int, default=200_000, help="dataframe and pipeline modes: source records (default 200k)"
    )
    p.add_argument("--files", type=int, default=8, help="pipeline mode: text files the records are written to")
    p.add_argument("--rounds", type=int, default=2, help="pipeline mode: alternating plain/tracked rounds")
    p.add_argument(
        "--reader-only",
        action="store_true",
        help="pipeline mode: each round also runs the job behind the pipeline's reading step with tracking off "
        "(the extra stage's own cost)",
    )
    p.add_argument(
        "--sink",
        choices=("sqlite", "parquet"),
        default="sqlite",
        help="pipeline mode: sqlite = the demo's word count into its SQLite sink (default); parquet = the words "
        "written as Parquet, plain df.write.parquet against SourcePipeline(output=FileOutput(...))",
    )
    p.add_argument(
        "--raise-fraction",
        type=float,
        default=0.0,
        help="pipeline mode: the tracked Parquet job with this fraction of records raising ValueError (e.g. 0.001) "
        "against the same job with none, in one run: time ratio and rows handed to the function",
    )
    p.add_argument(
        "--faults",
        default=None,
        help="queue mode: broker, driver, acker (comma-separated, in order; default none); "
        "exactly-once mode: fault kinds to inject with kill -9 (acker, driver, executor; rewrite, publish: the "
        "driver killed while its Parquet commit rewrites a file or moves its files into place; comma-separated; "
        "default acker,driver,executor): one run per kind, then a mixed run of the first three",
    )
    p.add_argument("--kills", type=int, default=3, help="exactly-once mode: faults of each kind per run (default 3)")
    p.add_argument("--mixed-only", action="store_true", help="exactly-once mode: only the mixed run")
    p.add_argument(
        "--sinks", default="parquet,table", help="exactly-once mode: destinations (parquet, table; default both)"
    )
    p.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis", help="queue mode: the broker")
    p.add_argument("--messages", type=int, default=10_000, help="queue mode: messages published (default 10k)")
    p.add_argument(
        "--keep", help="exactly-once and queue modes: keep the runs' files (logs, checkpoints, outputs) in this folder"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_simulate_arguments(p)
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
    p.add_argument(
        "--compare-replicas",
        action="store_true",
        help="apply mode: run the same load into embedded ackers with --replicas 1 and 2, alternating, and report "
        "the throughput and memory cost of keeping every tree on two ackers",
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
    if args.mode == "simulate":
        return simulate_mode(args)
    if args.message_timeout is None:
        # exactly-once: a killed acker's trees are replayed at the backstop, which follows the timeout.
        args.message_timeout = {"pipeline": 600.0, "exactly-once": 10.0, "queue": 10.0, "redrive": 600.0}.get(
            args.mode, 30.0
        )
    if args.fan_out < 1 or args.depth < 0 or args.processes < 1 or args.duration <= 0:
        print("acker-bench: --fan-out and --processes must be >= 1, --depth >= 0, --duration > 0", file=sys.stderr)
        return 2
    paced_by = [name for name, on in (("--rate", args.rate is not None), ("--find-capacity", args.find_capacity),
                                       ("--load-points", args.load_points)) if on]  # fmt: skip
    if len(paced_by) > 1:
        print(f"acker-bench: {' and '.join(paced_by)} each choose the rate; give one of them", file=sys.stderr)
        return 2
    if args.mode == "redrive":  # --rate caps the redrive's records/s
        return _redrive_mode(args)
    if (paced_by or args.api != "tuples") and args.mode != "trees":
        print("acker-bench: --api, --rate, --find-capacity and --load-points belong to --mode trees", file=sys.stderr)
        return 2
    if args.rate is not None and not args.rate > 0:
        print("acker-bench: --rate must be a positive number of trees per second", file=sys.stderr)
        return 2
    if args.mode == "trees":
        problem = _trees_problem(args)
        if problem:
            print(f"acker-bench: {problem}", file=sys.stderr)
            return 2
    if args.mode == "memory":
        return _memory_mode(args)
    if args.mode == "ledger":
        return _ledger_mode(args)
    if args.mode == "mass-timeout":
        return _mass_timeout_mode(args)
    if args.mode == "reshard":
        return _reshard_mode(args)
    if args.mode == "catchup":
        return _catchup_mode(args)
    if args.mode == "dataframe":
        return _dataframe_mode(args)
    if args.mode == "pipeline":
        return _pipeline_mode(args)
    if args.mode == "exactly-once":
        return _exactly_once_mode(args)
    if args.mode == "queue":
        return _queue_mode(args)
    if args.compare_tls:
        return _compare_tls_mode(args)
    if args.compare_replicas:
        return _compare_replicas_mode(args)
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
        with ClusterClient(addresses, security=security) as checked:
            replicas = checked.replicas
    else:
        from acker_service.process_cluster import ProcessCluster

        cluster = ProcessCluster(
            count=args.embedded_ackers,
            metrics_base_port=0,
            message_timeout=args.message_timeout,
            extra_args=("--engine", args.engine, "--replicas", str(args.replicas)),
        ).start()
        addresses, metrics_urls = tuple(cluster.addresses), list(cluster.metrics_urls or [])
        replicas = args.replicas
    try:
        if args.mode == "apply":
            cpu_before = _server_cpu(cluster)
            result = run_apply_bench(ApplyBenchConfig(
                addresses=addresses, batch_ops=args.batch_ops, duration=args.duration, processes=args.processes,
                security=security, replicas=replicas, transport=args.transport, in_flight=args.in_flight,
            ))  # fmt: skip
            _add_server_cpu(result, cpu_before, _server_cpu(cluster))
        else:
            result = _trees_mode(args, addresses, security)
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


def _trees_problem(args: argparse.Namespace) -> str | None:
    """Why the trees-mode options cannot run, before any acker is started; None if they can."""
    if not 0 < args.capacity_fraction <= 1:
        return f"--capacity-fraction must be in (0, 1], got {args.capacity_fraction}"
    if args.load_points is not None:
        try:
            loads = _loads(args.load_points)
        except ValueError:
            loads = []
        if not loads or not all(0 < load <= 1 for load in loads):
            return f"--load-points takes fractions of capacity in (0, 1] separated by commas, got {args.load_points!r}"
    try:
        _trees_config(args, ("unused:0",), None)
    except ValueError as err:
        return str(err)
    return None


def _loads(text: str) -> list[float]:
    """--load-points as floats (ValueError if one is not a number)."""
    return [float(part) for part in text.split(",") if part.strip()]


def _trees_config(
    args: argparse.Namespace, addresses: tuple[str, ...], security: ChannelSecurity | None
) -> BenchConfig:
    return BenchConfig(
        addresses=addresses, fan_out=args.fan_out, depth=args.depth, batch_size=args.batch_size,
        flush_interval=args.flush_interval, duration=args.duration, processes=args.processes,
        max_pending=args.max_pending, security=security, api=args.api, rate=args.rate, chunk=args.chunk,
        tick=args.tick,
    )  # fmt: skip


def _trees_mode(args: argparse.Namespace, addresses: tuple[str, ...], security: ChannelSecurity | None) -> dict:
    """--mode trees: flat out, at --rate, or --find-capacity (flat out, then at half the trees/s it reached)."""
    config = _trees_config(args, addresses, security)
    if args.find_capacity:
        return find_capacity(config, args.capacity_fraction)
    if args.load_points:
        return load_points(config, _loads(args.load_points))
    return run_bench(config)


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


def _compare_replicas_mode(args: argparse.Namespace) -> int:
    """Apply throughput and memory per pending tree with replicas 1 and 2, in the same run."""
    from .replicas import compare_replicas

    if args.mode != "apply" or args.ackers:
        print(
            "acker-bench: --compare-replicas runs --mode apply against embedded ackers (no --ackers)", file=sys.stderr
        )
        return 2
    result = compare_replicas(
        args.embedded_ackers, args.batch_ops, args.duration, args.processes, args.engine, _rss_from_proc
    )
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            f"acker-bench --mode apply --compare-replicas: {result['ackers']} ackers, {result['rounds']} rounds",
            _figure_rows(result),
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
        _print_rows("acker-bench: acker memory per pending tree", _figure_rows(result))
    return 0


def _pending_bytes(engine: str, trees: int, keyed_acks: int = 0) -> dict:
    from acker_service.process_cluster import ProcessCluster

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
            _figure_rows(result),
        )
    return 0 if result["outcomes_delivered"] == result["trees"] else 1


def _reshard_mode(args: argparse.Namespace) -> int:
    """--pending-trees trees pending on --from embedded ackers moved to --to (and --back) under steady load."""
    from .reshard import ReshardBench, run_reshard

    bench = ReshardBench(
        start=args.from_shards, to=args.to_shards, back=args.back, pending_trees=args.pending_trees,
        steady_seconds=max(1.0, args.duration / 4), engine=args.engine, replicas=args.replicas,
    )  # fmt: skip
    result = run_reshard(bench)
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            f"acker-bench --mode reshard: {args.from_shards} -> {args.to_shards}{' and back' if args.back else ''}",
            [(k.replace("_", " "), str(v)) for k, v in result.items()],
        )
    return 0 if result["lost"] == result["replayed"] == result["false_acks"] == 0 else 1


def _catchup_mode(args: argparse.Namespace) -> int:
    """One of 3 embedded ackers (--replicas 2) restarts with --pending-trees pending and catches up; then its partner goes."""
    from .catchup import CatchUpBench, run_catchup

    bench = CatchUpBench(
        pending_trees=args.pending_trees, steady_seconds=max(1.0, args.duration / 4), engine=args.engine,
    )  # fmt: skip
    result = run_catchup(bench)
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            f"acker-bench --mode catchup: {args.pending_trees:,} pending trees",
            [(k.replace("_", " "), str(v)) for k, v in result.items()],
        )
    return 0 if result["lost"] == result["replayed"] == result["false_acks"] == 0 else 1


def _dataframe_mode(args: argparse.Namespace) -> int:
    """Rows/s through a tracked 2-stage DataFrame pipeline and the same pipeline untracked, in one run."""
    from .dataframe import DataFrameBenchConfig, run_dataframe_bench

    config = DataFrameBenchConfig(
        records=args.records, fan_out=args.fan_out, batch=args.max_pending,
        ackers=args.embedded_ackers, message_timeout=args.message_timeout,
    )  # fmt: skip
    result = run_dataframe_bench(config)
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            f"acker-bench --mode dataframe: {result['records']:,} records, fan-out {result['fan_out']}",
            _figure_rows(result),
        )
    return 0 if result["records_acked"] == result["records"] else 1


def _pipeline_mode(args: argparse.Namespace) -> int:
    """The plain spark.read job against the tracked SourcePipeline over the same files, alternating, in one run."""
    from .pipeline_bench import PipelineBenchConfig, run_pipeline_bench

    if args.records < 1 or args.files < 1 or args.rounds < 1:
        print("acker-bench: --records, --files and --rounds must be >= 1", file=sys.stderr)
        return 2
    if not 0.0 <= args.raise_fraction < 1.0:
        print("acker-bench: --raise-fraction must be at least 0 and below 1 (e.g. 0.001 for 0.1%)", file=sys.stderr)
        return 2
    if args.sink == "parquet" and args.reader_only:
        print("acker-bench: --reader-only belongs to the SQLite word count (--sink sqlite)", file=sys.stderr)
        return 2
    config = PipelineBenchConfig(
        records=args.records, files=args.files, rounds=args.rounds, ackers=args.embedded_ackers,
        message_timeout=args.message_timeout, reader_only=args.reader_only,
        sink=args.sink, raise_fraction=args.raise_fraction,
    )  # fmt: skip
    result = run_pipeline_bench(config)
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            f"acker-bench --mode pipeline: {result['records']:,} lines in {result['files']} files",
            _figure_rows(result),
        )
    return 0 if result["sink_exact"] else 1


def _redrive_mode(args: argparse.Namespace) -> int:
    """--records dead letters redriven through a SourcePipeline job: seconds, records/s, each exactly once."""
    from .redrive import RedriveBenchConfig, run_redrive_bench

    if args.records < 1:
        print("acker-bench: --records must be >= 1", file=sys.stderr)
        return 2
    if args.rate is not None and not args.rate > 0:
        print("acker-bench: --rate must be a positive number of records per second", file=sys.stderr)
        return 2
    config = RedriveBenchConfig(
        records=args.records, ackers=args.embedded_ackers, message_timeout=args.message_timeout, rate=args.rate
    )
    result = run_redrive_bench(config)
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            f"acker-bench --mode redrive: {result['records']:,} dead letters",
            _figure_rows(result),
        )
    return 0 if result["exactly_once"] else 1


def _exactly_once_mode(args: argparse.Namespace) -> int:
    """kill -9 of ackers, drivers and executors under SourcePipeline runs; exit 1 unless every output is exact."""
    from .exactly_once import ExactlyOnceConfig, run_exactly_once

    config = ExactlyOnceConfig(
        records=args.records, faults=tuple(f for f in (args.faults or "acker,driver,executor").split(",") if f), kills=args.kills,
        per_kind=not args.mixed_only, ackers=args.embedded_ackers, replicas=args.replicas,
        message_timeout=args.message_timeout, sinks=tuple(s for s in args.sinks.split(",") if s), keep=args.keep,
    )  # fmt: skip
    result = run_exactly_once(config)
    if args.json:
        print(json.dumps(result))
    else:
        rows = [
            (
                "+".join(sorted(set(run["faults_planned"]))) or "none",
                f"faults {run['faults']}, {run.get('output_rows', 0):,} of {run.get('expected_rows', 0):,} rows, "
                f"{run.get('duplicates')} duplicates, {run.get('missing')} missing, "
                f"{run['wall_seconds']} s: {'ok' if run['ok'] else 'NOT OK ' + run.get('error', '')}",
            )
            for run in result["runs"]
        ]
        _print_rows(f"acker-bench --mode exactly-once: {result['records']:,} records, {result['wall_seconds']} s", rows)
    return 0 if result["ok"] else 1


def _queue_mode(args: argparse.Namespace) -> int:
    """A real broker's queue drained under faults; exit 1 unless every message ended acked once or dead-lettered."""
    from .queue_bench import QueueBenchConfig, run_queue_bench

    config = QueueBenchConfig(
        broker=args.broker,
        messages=args.messages,
        faults=tuple(f for f in (args.faults or "").split(",") if f),
        ackers=args.embedded_ackers,
        message_timeout=args.message_timeout,
        keep=args.keep,
    )
    result = run_queue_bench(config)
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            f"acker-bench --mode queue: {result['published']:,} messages on {result['broker']}",
            _figure_rows(result),
        )
    return 0 if result["ok"] else 1


def _ledger_mode(args: argparse.Namespace) -> int:
    """The ledger alone, in this process: native (columnar and request paths) against the reference."""
    result = run_ledger_bench(trees=args.trees, batch_ops=args.batch_ops, background=args.pending_trees)
    if args.json:
        print(json.dumps(result))
    else:
        _print_rows(
            f"acker-bench --mode ledger: {result['trees']:,} trees, {result['batch_ops']:,} ops per batch",
            _figure_rows(result),
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


def _figure_rows(result: dict) -> list[tuple[str, str]]:
    """A result's ``(name, value)`` rows for :func:`_print_rows`: numbers with thousands separators, the rest as text."""
    return [(k.replace("_", " "), f"{v:,}" if isinstance(v, (int, float)) else str(v)) for k, v in result.items()]


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
        f"acker-bench: {result['ackers']} acker(s), {result['processes']} client process(es), --api "
        f"{result['api']}, fan-out {result['fan_out']}, depth {result['depth']}, batch {result['batch_size']}"
    )
    rate = result["rate_requested"]
    rows = [
        ("ack ops/s", f"{result['ack_ops_per_s']:,.0f}"),
        ("trees/s", f"{result['trees_per_s']:,.0f}"),
        (
            "trees started/s (requested)",
            f"{result['trees_started_per_s']:,.0f} ({f'{rate:,.0f}' if rate else 'flat out'})",
        ),
        (
            "outcome latency p50 / p99 / max",
            f"{result['outcome_p50_ms']} / {result['outcome_p99_ms']} / {result['outcome_max_ms']} ms",
        ),
        (
            "trees acked / failed / unfinished",
            f"{result['trees_acked']:,} / {result['trees_failed']:,} / {result['trees_unfinished']:,}",
        ),
        ("server pending trees (max sampled)", f"{result['server_pending_trees_max']:,}"),
        ("server RSS per acker", rss),
        ("duration", f"{result['duration_s']} s"),
    ]
    if "capacity_trees_per_s" in result:
        rows.insert(0, ("capacity (flat-out trees/s)", f"{result['capacity_trees_per_s']:,.0f}"))
    for point in result.get("points", ()):
        rows.append(
            (
                f"at {point['load']:.0%} of capacity",
                f"{point['trees_per_s']:,.0f} trees/s, p50 {point['p50_ms']} / p99 {point['p99_ms']} ms",
            )
        )
    _print_rows(title, rows)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
