"""One executor-side outage during a SourcePipeline run on local Spark, with the replays it cost, as JSON.

Acker processes on loopback (``ProcessCluster``); every client, the driver's
and the executors', reaches them through one :class:`~tests.blips.proxy.BlipProxy`
per acker. A **cut** resets and refuses only the connections of other
processes than the driver's (``others_only``): the Spark executors' Python
workers lose the ackers while the driver keeps its outcome streams, as when
one worker machine's network is cut. A **pause** stops one acker (SIGSTOP)
for the outage and resumes it; a **kill** kill -9s one acker and restarts it
after the outage (run it with ``--replicas 2``). The job is the demo's word
count (``build_source_job``), so the sink tells whether the output is exact.

    .venv/bin/python -m tests.blips.spark_outage --fault none --records 40000 --message-timeout 15
    .venv/bin/python -m tests.blips.spark_outage --fault cut --seconds 10 --records 40000 --message-timeout 15
    .venv/bin/python -m tests.blips.spark_outage --fault pause --seconds 10 --records 40000 --message-timeout 15
    .venv/bin/python -m tests.blips.spark_outage --fault kill --seconds 10 --replicas 2 --records 40000 --message-timeout 15

The chaos tests (``tests/spark/test_executor_outages.py``) run smaller cases
of :func:`run_outage` in the test session's SparkSession.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from acker_client import ClusterClient
from acker_demo.dataframe_job import build_source_job
from acker_demo.wordcount import FailureInjection, create_sink, expected_counts, sink_counts
from acker_protocol.wire import Outcome
from acker_spark import ReplayPolicy, close_clients, generated_sentences
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.tracking.checkpoint import Checkpoint
from acker_spark.tracking.emission_log import round_dir

from .scenario import proxies

__all__ = ["FAULTS", "run_outage", "write_lines"]

FAULTS = ("none", "cut", "half_open", "pause", "kill")
# Replays come in rounds after the first: enough attempts that no record is dead-lettered for an outage.
POLICY = ReplayPolicy(max_attempts=8, backoff_base=0.05, backoff_cap=0.5)


def write_lines(folder: Path, count: int, files: int = 4) -> list[str]:
    """``count`` generated sentences over ``files`` text files; returns the lines."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [record.value for record in generated_sentences(count)]
    for index in range(files):
        (folder / f"part-{index}.txt").write_text("".join(f"{line}\n" for line in lines[index::files]))
    return lines


class _Fault(threading.Thread):
    """Waits for the first round's first trees and first FAILED outcome (plus ``delay``), then breaks things for ``seconds``."""

    def __init__(self, fault: str, seconds: float, delay: float, checkpoint: Path, cluster: Any, proxies: list[Any]):
        super().__init__(name="outage", daemon=True)
        self.fault, self.seconds, self.delay = fault, seconds, delay
        self.checkpoint, self.cluster, self.proxies = checkpoint, cluster, proxies
        self.trees_at: float | None = None  # monotonic, when the first round's first trees were logged
        self.started_at: float | None = None  # monotonic, when the outage began
        self.ended_at: float | None = None
        self._cancel = threading.Event()

    def _failed_outcome(self) -> bool:
        try:
            _, outcomes = Checkpoint(self.checkpoint).read_outcomes()
        except (OSError, ValueError):  # not written yet, or a batch half written
            return False
        return bool((outcomes == int(Outcome.FAILED)).any())

    def cancel(self) -> None:
        """Do not start the outage (the run ended first)."""
        self._cancel.set()

    def run(self) -> None:
        first_round = round_dir(self.checkpoint, 0)
        while not (first_round.is_dir() and any(first_round.iterdir())):
            if self._cancel.wait(0.05):
                return
        self.trees_at = time.monotonic()
        # Then the first FAILED outcome journaled: the last stage runs, with trees failed by the job itself
        # (the injected failures), as when a cut hits a job mid-way.
        while not self._failed_outcome():
            if self._cancel.wait(0.1):
                return
        if self._cancel.wait(self.delay):
            return
        self.started_at = time.monotonic()
        shard = 1
        if self.fault == "none":
            return
        if self.fault == "cut":
            for proxy in self.proxies:
                proxy.cut(self.seconds, others_only=True)
            time.sleep(self.seconds)
        elif self.fault == "half_open":
            for proxy in self.proxies:
                proxy.half_open(self.seconds, others_only=True)
            time.sleep(self.seconds)
        elif self.fault == "pause":
            pid = self.cluster.pid(shard)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(self.seconds)
            finally:
                os.kill(pid, signal.SIGCONT)
        elif self.fault == "kill":
            self.cluster.kill(shard, signal.SIGKILL)
            time.sleep(self.seconds)
            self.cluster.restart(shard)
        self.ended_at = time.monotonic()


def run_outage(
    spark: Any,
    cluster: Any,
    workdir: Path,
    *,
    records: int,
    fault: str,
    seconds: float,
    delay: float = 1.0,
    partitions: int = 4,
    fail_percent: float = 1.0,
    hang_grace: float = 5.0,
) -> dict[str, Any]:
    """Run the word count over ``records`` lines with ``fault`` mid-run; the run's figures (``replayed`` ...)."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
    lines = write_lines(workdir / "in", records)
    db, checkpoint = workdir / "sink.sqlite", workdir / "checkpoint"
    create_sink(db)
    with proxies(list(cluster.addresses)) as breakers:
        routed = [p.address for p in breakers]
        job, _ = build_source_job(
            routed, db, partitions=partitions, injection=FailureInjection(fail_percent=fail_percent)
        )
        outage = _Fault(fault, seconds, delay, checkpoint, cluster, breakers)
        error: BaseException | None = None
        with ClusterClient(routed) as driver_client:
            pipeline = SourcePipeline(
                spark, driver_client, checkpoint, policy=POLICY, on_undelivered="warn", hang_grace=hang_grace
            )
            outage.start()  # with no fault it only notes when the first trees were started
            started = time.monotonic()
            try:
                stats = pipeline.run(spark.read.text(str(workdir / "in")), job)
            except Exception as exc:  # noqa: BLE001 - reported in the figures: a failed run is a result here
                error, stats = exc, pipeline.stats
            ended = time.monotonic()
            outage.cancel()
            if outage.is_alive():
                outage.join()
        close_clients()  # the executors' shared clients pointed at these proxies
        refused = sum(p.refused for p in breakers)
    figures = stats.as_dict() if hasattr(stats, "as_dict") else dict(vars(stats))
    figures.pop("replayed_keys", None)
    figures.update(
        fault=fault,
        records=records,
        fail_percent=fail_percent,
        hang_grace=hang_grace,
        outage_seconds=seconds,
        run_seconds=round(ended - started, 1),
        first_trees_at=None if outage.trees_at is None else round(outage.trees_at - started, 1),
        # The outage must fall inside the run to mean anything: when it began and ended, from the run's start.
        outage_began_at=None if outage.started_at is None else round(outage.started_at - started, 1),
        outage_ended_at=None if outage.ended_at is None else round(outage.ended_at - started, 1),
        connections_refused=refused,  # by the proxies: the outage reached the executors
        sink_exact=sink_counts(db) == expected_counts([(str(i), line) for i, line in enumerate(lines)]),
        error=None if error is None else f"{type(error).__name__}: {error}"[:500],
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    """Command line: a fresh acker cluster and a local SparkSession, one run, its figures as JSON."""
    import tempfile

    from acker_spark import LOCAL_MASTER, local_session

    from acker_service.process_cluster import ProcessCluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", choices=FAULTS, default="cut")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds after the first trees before the outage")
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--message-timeout", type=float, default=15.0)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument(
        "--fail-percent", type=float, default=1.0, help="injected word failures (the demo's flaky records)"
    )
    args = parser.parse_args(argv)
    extra = ("--replicas", "2") if args.replicas == 2 else ()
    session = local_session(LOCAL_MASTER, app_name="spark-outage", shuffle_partitions=4)
    try:
        with (
            tempfile.TemporaryDirectory() as workdir,
            ProcessCluster(3, message_timeout=args.message_timeout, extra_args=extra) as cluster,
        ):
            figures = run_outage(
                session,
                cluster,
                Path(workdir),
                records=args.records,
                fault=args.fault,
                seconds=args.seconds,
                delay=args.delay,
                fail_percent=args.fail_percent,
            )
        figures.update(replicas=args.replicas, message_timeout=args.message_timeout)
        print(json.dumps(figures))
    finally:
        session.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
