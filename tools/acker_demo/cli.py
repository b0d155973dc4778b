"""``acker-demo``: a tracked PySpark word count against a local 3-acker cluster, with faults injected.

Starts the ackers as real processes on free ports and a local Spark, runs
sentences -> words (anchored) -> shuffle by word -> idempotent SQLite sink,
while failing some words, crashing a task attempt and killing one acker. Ends
with a summary; exit status 0 only if every record was acked or dead-lettered
and the sink's word counts equal the counts computed from the input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acker_client import AckerError
from acker_spark.dead_letter import DeadLetterStore
from acker_spark.replay_policy import ReplayPolicy
from acker_spark.run_report import RunStats
from acker_spark.session import LOCAL_MASTER, local_session
from acker_spark.sources import Record, TextDirectorySource, generated_sentences
from acker_spark.steps.executor import close_clients
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from acker_service.process_cluster import ClusterError

from . import wordcount

__all__ = ["main", "parse_args", "run_demo", "AckerChaos"]

log = logging.getLogger("acker_demo")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The demo's command line."""
    p = argparse.ArgumentParser(
        prog="acker-demo",
        description="Tracked PySpark word count with failure injection, against a local 3-acker cluster.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = p.add_argument_group("input")
    src.add_argument("--records", type=int, default=2000, help="generated sentences")
    src.add_argument("--seed", type=int, default=42, help="seed of the generated sentences")
    src.add_argument("--source-dir", type=Path, help="read a directory of text files (one record per line) instead")
    src.add_argument(
        "--source",
        choices=("memory", "redis"),
        default="memory",
        help="redis: publish the records to a Redis stream (a redis-server the demo starts in a temp dir) and drain "
        "it with SourcePipeline, each message acked at Redis after its rows are committed (implies --spark-read)",
    )
    faults = p.add_argument_group("failure injection (needs tracking)")
    faults.add_argument("--fail-percent", type=float, default=2.0, help="transient per-word failures, in percent")
    faults.add_argument(
        "--crash-task",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="crash the first attempt of one counting task mid-partition (Spark retries it)",
    )
    faults.add_argument(
        "--kill-acker-after",
        type=float,
        default=5.0,
        help="SIGKILL acker shard 1 after this many seconds (0: never)",
    )
    faults.add_argument("--restart-after", type=float, default=3.0, help="restart the killed acker this much later")
    track = p.add_argument_group("tracking")
    track.add_argument("--max-attempts", type=int, default=8, help="deliveries per record before dead-lettering")
    track.add_argument("--backoff", type=float, default=0.5, help="seconds before the first replay (doubles, cap 8 s)")
    track.add_argument("--message-timeout", type=float, default=8.0, help="the ackers' tree timeout, seconds")
    track.add_argument("--max-pending", type=int, default=500, help="untracked runs: records per micro-batch")
    # --shards, not --ackers: across the CLIs --ackers is always an address list.
    track.add_argument("--shards", type=int, default=3, help="acker shards to start")
    track.add_argument("--no-tracking", action="store_true", help="run the same pipeline without the acker (baseline)")
    track.add_argument(
        "--dataframe", action="store_true", help="the DataFrame job of ArrowBolts (mapInArrow) instead of RDD bolts"
    )
    track.add_argument(
        "--spark-read",
        action="store_true",
        help="the DataFrame job writing its words as Parquet through the pipeline's exactly-once output "
        "(implies --dataframe; --source-dir is read with spark.read.text) instead of the idempotent SQLite sink",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    out.add_argument(
        "--compare-untracked",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="run the pipeline ROUNDS times untracked and tracked, alternating, on one SparkSession; "
        "report both pipeline times and their ratio (the tracking overhead)",
    )
    out.add_argument("--db", type=Path, help="SQLite file for the sink and dead letters (default: a temp dir)")
    out.add_argument("--partitions", type=int, default=4, help="Spark partitions per stage")
    out.add_argument("--master", default=LOCAL_MASTER, help="Spark master")
    args = p.parse_args(argv)
    if args.records < 0 or args.max_attempts < 1 or args.max_pending < 1 or args.shards < 1 or args.partitions < 1:
        p.error("--records must be >= 0; --max-attempts, --max-pending, --shards and --partitions >= 1")
    if not 0 <= args.fail_percent <= 100:
        p.error("--fail-percent must be between 0 and 100")
    if args.kill_acker_after and args.shards < 2:
        p.error("--kill-acker-after needs at least 2 ackers (shard 1 is killed)")
    if args.source == "redis":
        args.spark_read = True  # a queue is drained by SourcePipeline
    if args.spark_read:
        args.dataframe = True
        if args.no_tracking or args.compare_untracked:
            p.error(
                "--spark-read runs the tracked SourcePipeline (acker-bench --mode pipeline compares it with plain Spark)"
            )
    if args.compare_untracked < 0 or (args.compare_untracked and args.no_tracking):
        p.error("--compare-untracked takes a number of rounds >= 1 and runs both modes itself (no --no-tracking)")
    return args


class AckerChaos:
    """Kills one acker shard after a delay and restarts it a little later, on a background thread."""

    def __init__(
        self,
        cluster: Any,
        shard: int,
        after: float,
        restart_after: float,
        on_event: Callable[[str], None] = log.warning,
    ) -> None:
        self.cluster, self.shard, self.after, self.restart_after = cluster, shard, after, restart_after
        self.on_event = on_event
        self.killed = False
        self.restarted = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="acker-chaos", daemon=True)

    def __enter__(self) -> AckerChaos:
        if self.after > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        if self._stop.wait(self.after):
            return
        self.cluster.kill(self.shard)
        self.killed = True
        self.on_event(f"acker shard {self.shard} killed (SIGKILL) after {self.after:g} s; its trees are lost")
        # Restart even when the run has ended meanwhile: the cluster is stopped cleanly after.
        self._stop.wait(self.restart_after)
        self.cluster.restart(self.shard)
        self.restarted = True
        self.on_event(f"acker shard {self.shard} restarted with an empty ledger")


@dataclass
class _Live:
    """The rich progress bar, fed from RunStats snapshots."""

    progress: Progress
    task: Any

    def event(self, message: str) -> None:
        self.progress.console.print(f"[yellow]{message}")

    def update(self, stats: RunStats) -> None:
        self.progress.update(
            self.task,
            completed=stats.acked + stats.dead_lettered,
            pending=stats.pending,
            replayed=stats.replayed,
            dead=stats.dead_lettered,
        )


@contextlib.contextmanager
def _live_progress(total: int, enabled: bool) -> Iterator[_Live | None]:
    if not enabled:
        yield None
        return
    progress = Progress(
        TextColumn("[bold]acked"),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TextColumn("pending {task.fields[pending]} replayed {task.fields[replayed]} dead {task.fields[dead]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    with progress:
        yield _Live(progress, progress.add_task("acked", total=total, pending=0, replayed=0, dead=0))


def _load_records(args: argparse.Namespace) -> list[Record]:
    if args.source_dir is not None:
        return list(TextDirectorySource(args.source_dir))
    return list(generated_sentences(args.records, seed=args.seed))


def crash_marker(db: Path) -> Path:
    """The file beside the sink that makes --crash-task crash one task per run (see FailureInjection)."""
    return db.with_name(db.name + ".crashed")


def _injection(args: argparse.Namespace, db: Path) -> wordcount.FailureInjection:
    # Without tracking a failed word is simply lost: only the crash, which
    # Spark itself recovers, is meaningful in the baseline.
    return wordcount.FailureInjection(
        fail_percent=0.0 if args.no_tracking else args.fail_percent,
        crash_partition=0 if args.crash_task else None,
        crash_marker=str(crash_marker(db)),
    )


def _build_job(args: argparse.Namespace, *, tracked: bool) -> Any:
    """The job builder: RDD bolts, or with --dataframe the ArrowBolt job (same signature, same sink).

    Tracked, the job takes SourcePipeline's frame of the records; untracked, a
    batch of the records themselves (see :mod:`.untracked`).
    """
    if args.dataframe:
        from . import dataframe_job  # pyarrow: only for the DataFrame job

        return dataframe_job.build_source_job if tracked else dataframe_job.build_job
    return wordcount.build_source_job if tracked else wordcount.build_job


def _run_tracked(
    args: argparse.Namespace, spark: Any, records: list[Record], db: Path, live: _Live | None
) -> dict[str, Any]:
    from acker_client import ClusterClient
    from acker_spark.executor_read.source_pipeline import SourcePipeline

    from acker_service.process_cluster import ProcessCluster

    # A fresh checkpoint per run, beside the sink: the records are copied into it once and read from there.
    checkpoint = db.parent / f"{db.stem}-checkpoints" / f"run-{time.time_ns()}"
    with ProcessCluster(count=args.shards, message_timeout=args.message_timeout) as cluster:
        build = _build_job(args, tracked=True)
        job, bolts = build(cluster.addresses, db, partitions=args.partitions, injection=_injection(args, db))
        policy = ReplayPolicy(max_attempts=args.max_attempts, backoff_base=args.backoff, backoff_cap=8.0)
        chaos = AckerChaos(cluster, 1, args.kill_acker_after, args.restart_after, live.event if live else log.warning)
        with ClusterClient(cluster.addresses) as client, chaos:
            pipeline = SourcePipeline(
                spark,
                client,
                checkpoint,
                name="acker-demo",
                policy=policy,
                dead_letters=DeadLetterStore(db),
                on_progress=live.update if live else None,
            )
            started = time.perf_counter()
            stats = pipeline.run(records, job)
            seconds = time.perf_counter() - started
    close_clients()
    return {
        **stats.as_dict(),
        "pipeline_seconds": round(seconds, 3),
        "acker_killed": chaos.killed,
        "acker_restarted": chaos.restarted,
        "commit_errors": sum(b.commit_errors.value for b in bolts if b.commit_errors is not None),
    }


def _run_untracked(
    args: argparse.Namespace, spark: Any, records: list[Record], db: Path, live: _Live | None
) -> dict[str, Any]:
    from .untracked import run_untracked

    job, _ = _build_job(args, tracked=False)(None, db, partitions=args.partitions, injection=_injection(args, db))
    started = time.perf_counter()
    stats = run_untracked(
        spark,
        records,
        job,
        batch_size=args.max_pending,
        partitions=args.partitions,
        on_progress=live.update if live else None,
        as_dataframe=args.dataframe,
    )
    seconds = time.perf_counter() - started
    return {
        **stats.as_dict(),
        "pipeline_seconds": round(seconds, 3),
        "acker_killed": False,
        "acker_restarted": False,
        "commit_errors": 0,
    }


def run_demo(args: argparse.Namespace, spark: Any, db: Path, *, show_progress: bool = True) -> dict[str, Any]:
    """Run the demo's pipeline once on ``spark`` with results in ``db``; return the summary dict."""
    started = time.perf_counter()
    records = _load_records(args)
    wordcount.create_sink(db, clear=True)
    crash_marker(db).unlink(missing_ok=True)  # each run crashes its one task
    runner = _run_untracked if args.no_tracking else _run_tracked
    with _live_progress(len(records), show_progress) as live:
        if args.spark_read:
            from .source_run import run_source_tracked

            def chaos(cluster: Any) -> AckerChaos:
                event = live.event if live else log.warning
                return AckerChaos(cluster, 1, args.kill_acker_after, args.restart_after, event)

            summary = run_source_tracked(args, spark, records, db, live, chaos)
        else:
            summary = runner(args, spark, records, db, live)
    if args.spark_read:
        from .source_run import expected_without_dead, output_check

        expected = expected_without_dead(records, db)
        actual, output_rows, duplicates = output_check(spark, summary["output"])
        summary.update(output_rows=output_rows, output_duplicates=duplicates)
    else:
        expected = wordcount.expected_counts(records, DeadLetterStore(db).keys())
        actual = wordcount.sink_counts(db)
    summary.update(
        mode="untracked" if args.no_tracking else "tracked",
        api="spark-read" if args.spark_read else "dataframe" if args.dataframe else "rdd",
        records=len(records),
        words_expected=sum(expected.values()),
        words_in_sink=sum(actual.values()),
        sink_matches_expected=expected == actual and not summary.get("output_duplicates"),
        all_records_accounted=summary["acked"] + summary["dead_lettered"] == len(records) == summary["emitted"],
        wall_seconds=round(time.perf_counter() - started, 3),
    )
    return summary


_ROWS = (
    ("emitted", "records emitted"),
    ("acked", "acked"),
    ("failed", "failed (deliveries)"),
    ("timed_out", "timed out (deliveries)"),
    ("lost", "lost (deliveries)"),
    ("replayed", "replayed (deliveries)"),
    ("dead_lettered", "dead-lettered"),
    ("jobs", "Spark jobs"),
    ("job_errors", "Spark jobs failed"),
    ("commit_errors", "task commits dropped (acker down)"),
    ("acker_killed", "acker killed and restarted"),
    ("words_in_sink", "words in sink"),
    ("output_rows", "rows in the Parquet output"),
    ("output_duplicates", "duplicate rows in the output"),
    ("sink_matches_expected", "sink matches expected"),
    ("pipeline_seconds", "pipeline time (s)"),
    ("wall_seconds", "wall time (s)"),
)


def _summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"acker-demo summary ({summary['mode']})", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for key, label in _ROWS:
        value = summary.get(key)
        if isinstance(value, bool):
            text = "[green]yes" if value else "[red]no"
            if key == "acker_killed" and not summary["mode"] == "tracked":
                text = "-"
        else:
            text = str(value)
        table.add_row(label, text)
    return table


@contextlib.contextmanager
def _quiet_expected_warnings() -> Iterator[None]:
    """Raise two loggers' levels for the run, restoring them after (main() also runs inside tests)."""
    # The demo kills an acker on purpose: the client's per-batch warnings and the
    # cluster's "exited unexpectedly" would drown the progress bar; the demo
    # reports the kill itself and the summary counts what those warnings report.
    levels = {"acker_client": logging.ERROR, "acker_service.process_cluster": logging.CRITICAL}
    saved = {name: logging.getLogger(name).level for name in levels}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``acker-demo``; returns the exit status."""
    args = parse_args(argv)
    try:
        return _main(args)
    except (AckerError, ClusterError) as err:
        print(f"acker-demo: {getattr(err, 'headline', err)}", file=sys.stderr)  # ClusterError: one line
        return 1


def compare_untracked(args: argparse.Namespace, spark: Any, db: Path) -> dict[str, Any]:
    """Untracked and tracked runs of the same pipeline, alternating on one session: both times and their ratio.

    Alternating (untracked first in each round) spreads a warming JVM and a
    busy machine over both modes; the ratio of the medians is the figure the
    README reports. Every run must still be exact (sink and accounting).
    """
    runs: dict[str, list[dict[str, Any]]] = {"untracked": [], "tracked": []}
    for _ in range(args.compare_untracked):
        for mode in runs:
            one = argparse.Namespace(**{**vars(args), "no_tracking": mode == "untracked"})
            runs[mode].append(run_demo(one, spark, db, show_progress=False))
    seconds = {mode: [r["pipeline_seconds"] for r in done] for mode, done in runs.items()}
    medians = {mode: statistics.median(times) for mode, times in seconds.items()}
    every = [r for done in runs.values() for r in done]
    return {
        "mode": "compare",
        "api": every[0]["api"],
        "records": every[0]["records"],
        "rounds": args.compare_untracked,
        "untracked_pipeline_seconds": seconds["untracked"],
        "tracked_pipeline_seconds": seconds["tracked"],
        "tracked_over_untracked": round(medians["tracked"] / medians["untracked"], 3),
        "sink_matches_expected": all(r["sink_matches_expected"] for r in every),
        "all_records_accounted": all(r["all_records_accounted"] for r in every),
        "acked": sum(r["acked"] for r in runs["tracked"]),
        "dead_lettered": sum(r["dead_lettered"] for r in runs["tracked"]),
    }


def _main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_quiet_expected_warnings())
        if args.db is None:
            db = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="acker-demo-"))) / "demo.sqlite"
        else:
            db = args.db
        from pyspark.sql import SparkSession

        owned = SparkSession.getActiveSession() is None
        spark = local_session(args.master, app_name="acker-demo", shuffle_partitions=args.partitions)
        if owned:
            stack.callback(spark.stop)
        if args.compare_untracked:
            summary = compare_untracked(args, spark, db)
        else:
            summary = run_demo(args, spark, db, show_progress=not args.json or sys.stderr.isatty())
    summary["wall_seconds"] = round(time.perf_counter() - started, 3)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    elif args.compare_untracked:
        for key, value in summary.items():
            Console().print(f"{key}: {value}")
    else:
        Console().print(_summary_table(summary))
        if args.db is not None:
            Console().print(f"sink and dead letters: {args.db}")
    ok = summary["sink_matches_expected"] and summary["all_records_accounted"]
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
