"""SourcePipeline under real Spark speculation, run by test_source_speculation.py in a process of its own.

A 2-host standalone Spark with ``spark.speculation`` on and 2 acker processes.
The records are text files read by ``spark.read.text``; in stage 1 (the task
that reads the records and starts their trees) the first attempt of partition
0 stalls after its split until a speculative copy on the other host has split
the same records: the copy re-reads them and re-sends the same set-once inits,
both attempts commit the same acks (deduplicated), and every record must be
acked exactly once with an exact sink and no replay. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

from acker_demo.dataframe_job import WORD_SCHEMA, CountWordRows, split_sentences
from acker_demo.wordcount import create_sink, expected_counts, sink_counts
from acker_spark import ArrowBolt, ReplayPolicy, close_clients, generated_sentences, local_session
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.tracking.emission_log import read_round

# Run as a script: its own folder (tests/spark) is first on sys.path.
from speculation_job import SPECULATION, WAIT_CAP
from standalone import StandaloneCluster

from acker_service.process_cluster import ProcessCluster


class StallFirstAttempt:
    """The split bolt; partition 0's attempt 0 waits (bounded) until another attempt of it has split its records."""

    def __init__(self, marks: Path) -> None:
        self.marks = str(marks)

    def __call__(self, batch: Any, collector: Any) -> None:
        from pyspark import TaskContext

        split_sentences(batch, collector)
        context = TaskContext.get()
        partition, attempt = context.partitionId(), context.attemptNumber()
        Path(self.marks, f"p{partition}-a{attempt}-{socket.gethostname()}-{time.time_ns()}").touch()
        if partition == 0 and attempt == 0:
            deadline = time.monotonic() + WAIT_CAP
            while not list(Path(self.marks).glob("p0-a1-*")) and time.monotonic() < deadline:
                time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    """Start the ackers and the 2-host Spark, run the pipeline, print the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    work: Path = args.work_dir
    (work / "in").mkdir(parents=True)
    (work / "marks").mkdir()
    lines = [r.value for r in generated_sentences(80, seed=5)]
    for index in range(4):
        (work / "in" / f"part-{index}.txt").write_text("".join(f"{line}\n" for line in lines[index::4]))
    db = work / "sink.sqlite"
    create_sink(db)
    with (
        ProcessCluster(count=2, message_timeout=120.0) as ackers,
        StandaloneCluster(workers=2, cores=2, work_dir=work / "spark") as cluster,
    ):
        spark = local_session(
            cluster.master_url,
            app_name="acker-source-speculation",
            shuffle_partitions=4,
            extra_conf={**cluster.session_conf(), **SPECULATION},
        )
        try:
            spark.sparkContext.parallelize(range(8), 4).count()  # start the executors' Python workers first
            split = ArrowBolt(StallFirstAttempt(work / "marks"), ackers.addresses, schema=WORD_SCHEMA, name="split")
            count = ArrowBolt(CountWordRows(db), ackers.addresses, schema=None, name="count")

            def job(df: Any) -> None:
                renamed = df.selectExpr("_record_key AS key", "value", "_attempt AS attempt", "_acker_ids")
                count.apply_df(split.apply_df(renamed).repartition(4, "word")).count()

            from acker_client import ClusterClient

            with ClusterClient(ackers.addresses) as client:
                policy = ReplayPolicy(max_attempts=3, backoff_base=0.05)
                stats = SourcePipeline(spark, client, work / "checkpoint", policy=policy).run(
                    spark.read.text(str(work / "in")), job
                )
        finally:
            spark.stop()
            close_clients()
    first_round = read_round(work / "checkpoint", 0)
    result = {
        "stats": stats.as_dict(),
        "records": len(lines),
        "sink_exact": sink_counts(db) == expected_counts([(str(i), v) for i, v in enumerate(lines)]),
        "marks": sorted(p.name.rsplit("-", 1)[0] for p in (work / "marks").iterdir()),
        "partition_0_logs": len(list((work / "checkpoint" / "emissions" / "r00000").glob("p00000-*.arrow"))),
        "duplicates": first_round.duplicates,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
