"""A tracked word count under real Spark speculation, run by test_speculation.py in a process of its own.

``spark.speculation`` is fixed per SparkContext and the test suite shares one,
and ``local[N]`` is a single host on which Spark never places a speculative
copy; so this script starts its own 2-host standalone Spark
(:class:`acker_spark.testing.StandaloneCluster`) and 2 acker processes, and
runs sentences -> split -> shuffle by word -> count into an SQLite sink with:

- split partition ``SLOW_AFTER_COMMIT``: attempt 0 commits its acks, then
  waits until a speculative attempt has committed the same acks (which the
  acker must deduplicate);
- split partition ``STALLED``: attempt 0 stalls holding acks until Spark kills
  it after a speculative attempt wins (nothing of it may reach the acker).

Every bolt run is logged to an attempt directory (partition, attempt number,
host, acks applied and deduplicated according to its commit's ApplyResponses).
It prints one JSON object for the test: the attempt log, the pipeline's stats,
whether the sink matches the input, and the ackers' Prometheus counters read
after Spark stopped. The records go through a ``SourcePipeline`` (copied into
its checkpoint, read by Spark) and its frame becomes an RDD (``tracked_rdd``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from acker_client import ClusterClient
from acker_demo.wordcount import (
    CountWords,
    create_sink,
    expected_counts,
    sink_counts,
    split_words,
    stable_partition,
    word_of,
)
from acker_spark import (
    Bolt,
    DeadLetterStore,
    ReplayPolicy,
    SourcePipeline,
    close_clients,
    local_session,
    tracked_rdd,
)
from acker_spark.steps.executor import client_for

# Run as a script: its own folder (tests/spark) is first on sys.path.
from prometheus_client.parser import text_string_to_metric_families
from standalone import StandaloneCluster

from acker_service.process_cluster import ProcessCluster

SLOW_AFTER_COMMIT = 1
STALLED = 2
PARTITIONS = 4
# Bounds on the waits that provoke speculation: only reached if Spark never
# speculates (the test then fails on the attempt log, not on a hang).
WAIT_CAP = 90.0

SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "100ms",
    # Speculate on run time alone: the efficiency heuristic (records per second)
    # would also be satisfied here, but later and less predictably.
    "spark.speculation.efficiency.enabled": "false",
}


def wait_until(ready: Callable[[], bool], cap: float = WAIT_CAP) -> bool:
    """Poll ``ready`` until it holds or ``cap`` seconds pass; return whether it held."""
    deadline = time.monotonic() + cap
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class AttemptLog:
    """One JSON file per bolt-run event in a shared directory (executors are other processes)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write(self, stage: str, event: str, **data: Any) -> None:
        """Record ``event`` of the running task attempt (written whole, then renamed into place)."""
        spark_stage, partition, attempt = task()
        path = self.directory / f"{spark_stage}-{partition}-{attempt}-{event}.json"
        tmp = path.with_suffix(".tmp")
        record = dict(stage=stage, spark_stage=spark_stage, partition=partition, attempt=attempt, event=event)
        tmp.write_text(json.dumps({**record, **data}))
        tmp.rename(path)

    def committed(self, spark_stage: int, partition: int, min_attempt: int) -> bool:
        """True once an attempt numbered ``min_attempt`` or more of that task has committed."""
        return any(
            json.loads(p.read_text())["attempt"] >= min_attempt
            for p in self.directory.glob(f"{spark_stage}-{partition}-*-committed.json")
        )

    def events(self) -> list[dict[str, Any]]:
        """Every event recorded, in no particular order."""
        return [json.loads(p.read_text()) for p in sorted(self.directory.glob("*.json"))]


def task() -> tuple[int, int, int]:
    """(Spark stage id, partition, attempt number) of the running Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.stageId(), context.partitionId(), context.attemptNumber()


def observed(bolt: Bolt, stage: str, log: AttemptLog) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A mapPartitions function running ``bolt`` and logging the attempt and what its commit did."""

    def run(tuples: Iterator[Any]) -> Iterator[Any]:
        spark_stage, partition, attempt = task()
        common = dict(pid=os.getpid(), host=os.environ.get("SPARK_LOCAL_IP", "?"))
        log.write(stage, "started", **common)
        client = client_for(bolt.addresses)
        # A Python worker runs one task at a time, and only the bolt uses this
        # client: the counters' change over the run is this attempt's commit.
        before = client.stats
        inputs = 0

        def counted() -> Iterator[Any]:
            nonlocal inputs
            for t in tuples:
                inputs += 1
                yield t

        yield from bolt.run_partition(partition, counted())  # commits when its input is exhausted
        after = client.stats
        log.write(
            stage,
            "committed",
            inputs=inputs,
            applied=after.applied - before.applied,
            deduplicated=after.deduplicated - before.deduplicated,
            dropped=after.operations_dropped - before.operations_dropped,
            **common,
        )
        if stage == "split" and (partition, attempt) == (SLOW_AFTER_COMMIT, 0):
            # Still "running" to Spark after committing: slow enough to be speculated.
            wait_until(lambda: log.committed(spark_stage, partition, 1))

    return run


class StallingSplit:
    """split_words, except that attempt 0 of partition STALLED stops after one sentence, its ack held."""

    def __init__(self, log: AttemptLog) -> None:
        self.log = log

    def __call__(self, tuples: Iterator[Any], collector: Any) -> Iterator[Any]:
        _, partition, attempt = task()
        for n, sentence in enumerate(tuples):
            if (partition, attempt, n) == (STALLED, 0, 1):
                self.log.write("split", "stalled", pid=os.getpid(), held=collector.held)
                # Spark kills this attempt once a speculative copy succeeds.
                time.sleep(WAIT_CAP)
            yield from split_words(iter([sentence]), collector)


def acker_metrics(urls: list[str]) -> dict[str, float]:
    """The ackers' counters and gauges this test checks, summed over shards."""
    totals: dict[str, float] = {}
    for url in urls:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                label = sample.labels.get("outcome") or sample.labels.get("kind")
                name = f"{sample.name}{{{label}}}" if label else sample.name
                totals[name] = totals.get(name, 0.0) + sample.value
    wanted = (
        "acker_operations_deduplicated_total",
        "acker_outcomes_total{acked}",
        "acker_outcomes_total{failed}",
        "acker_outcomes_total{timed_out}",
        "acker_pending_trees",
        "acker_trees_initialized_total",
    )
    return {name: totals.get(name, 0.0) for name in wanted}


def process_gone(pid: int) -> bool:
    """True if no process has id ``pid`` (executors run on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def run_pipeline(spark: Any, addresses: list[str], work: Path, records: list[Any]) -> dict[str, Any]:
    """Run the speculated word count through a SourcePipeline (RDD bolts over its records); its stats and the log."""
    db = work / "sink.sqlite"
    create_sink(db)
    log = AttemptLog(work / "attempts")
    log.directory.mkdir()
    split = Bolt(StallingSplit(log), addresses, name="split")
    count = Bolt(CountWords(db), addresses, name="count")

    calls = []

    def job(df: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            return  # the pipeline's check on an empty frame: its tasks must not enter the attempt log
        deliveries = tracked_rdd(df.selectExpr("_record_key AS key", "value", "_attempt AS attempt", "_acker_ids"))
        # Hash-partitioned by key into PARTITIONS split tasks, as the attempt log's partitions expect.
        rdd = deliveries.keyBy(lambda t: t.value.key).partitionBy(PARTITIONS, stable_partition).values()
        words = rdd.mapPartitions(observed(split, "split", log))
        by_word = words.keyBy(word_of).partitionBy(PARTITIONS, stable_partition).values()
        by_word.mapPartitions(observed(count, "count", log)).count()

    with ClusterClient(addresses) as client:
        pipeline = SourcePipeline(
            spark,
            client,
            work / "checkpoint",
            policy=ReplayPolicy(max_attempts=3, backoff_base=0.1),
            dead_letters=DeadLetterStore(db),
            progress=None,
        )
        stats = pipeline.run(records, job)
    stalled = [e for e in log.events() if e["event"] == "stalled"]
    return dict(
        stats=stats.as_dict(),
        sink_matches_expected=sink_counts(db) == expected_counts(records),
        # Whether Spark killed the stalled attempt's Python worker (bounded wait).
        stalled_attempt_killed=bool(stalled) and wait_until(lambda: process_gone(stalled[0]["pid"]), cap=60.0),
        log=log,
    )


def main(argv: list[str] | None = None) -> int:
    """Start ackers and a 2-host Spark with speculation, run the pipeline, print the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--records", type=int, default=40)
    args = parser.parse_args(argv)
    from acker_spark import generated_sentences

    records = list(generated_sentences(args.records, seed=11))
    # A tree must outlive the job, which waits for speculation: a generous timeout.
    with (
        ProcessCluster(count=2, message_timeout=30.0, metrics_base_port=0) as ackers,
        StandaloneCluster(workers=2, cores=2, work_dir=args.work_dir / "spark") as cluster,
    ):
        spark = local_session(
            cluster.master_url,
            app_name="acker-speculation",
            shuffle_partitions=PARTITIONS,
            extra_conf={**cluster.session_conf(), **SPECULATION},
        )
        try:
            # Start every executor's Python workers before the measured job.
            spark.sparkContext.parallelize(range(8), PARTITIONS).count()
            result = run_pipeline(spark, ackers.addresses, args.work_dir, records)
        finally:
            spark.stop()
            close_clients()
        # Spark is stopped: no task can commit any more, so the counters are final.
        result["acker"] = acker_metrics(ackers.metrics_urls or [])
    result["events"] = result.pop("log").events()
    result.update(records=len(records), slow_after_commit=SLOW_AFTER_COMMIT, stalled=STALLED)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
