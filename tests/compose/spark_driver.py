"""The driver of the standalone-cluster case: run in the spark-driver container, never imported by pytest.

``python spark_driver.py SHARED`` (SHARED: the folder every Spark container
sees at the same path) runs ``SourcePipeline.run(spark.read.text(SHARED/in),
job)`` against the master at ``$SPARK_MASTER_URL`` with the ackers at
``$ACKER_ADDRESSES``: the records are read, their trees started and acked on the
executors of the worker containers. The split bolt touches a file named after
the host and process it runs in (``SHARED/hosts``), and the run's statistics,
this driver's host name and Spark's executor hosts go to ``SHARED/result.json``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any


class RecordingSplit:
    """The demo's split bolt, leaving a trace of where it ran: a file per host and Python worker."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, batch: Any, collector: Any) -> None:
        from acker_demo.dataframe_job import split_sentences

        split_sentences(batch, collector)
        Path(self.folder, f"{socket.gethostname()}-{os.getpid()}").touch()


def main(shared: Path) -> None:
    """Run the pipeline once over SHARED/in; write SHARED/result.json."""
    from acker_client import ClusterClient
    from acker_demo.dataframe_job import WORD_SCHEMA, CountWordRows
    from acker_demo.wordcount import create_sink
    from acker_spark import ArrowBolt, ReplayPolicy, close_clients
    from acker_spark.executor_read.source_pipeline import SourcePipeline
    from pyspark.sql import SparkSession

    started = time.monotonic()
    # Client mode: executors connect back to this container by its address on the network.
    address = socket.gethostbyname(socket.gethostname())
    spark = (
        SparkSession.builder.master(os.environ["SPARK_MASTER_URL"])
        .appName("acker-compose-standalone")
        .config("spark.driver.host", address)
        .config("spark.driver.bindAddress", "0.0.0.0")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "1g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    addresses = os.environ["ACKER_ADDRESSES"].split(",")
    db = shared / "sink.sqlite"
    create_sink(db)
    hosts = shared / "hosts"
    hosts.mkdir()
    split = ArrowBolt(RecordingSplit(str(hosts)), addresses, schema=WORD_SCHEMA, name="split")
    count = ArrowBolt(CountWordRows(db), addresses, schema=None, name="count")

    def job(df: Any) -> None:
        # No shuffle: a tree is started and acked within one task, well inside the
        # compose ackers' short message timeout.
        words = split.apply_df(df.selectExpr("_record_key AS key", "value", "_attempt AS attempt", "_acker_ids"))
        count.apply_df(words).count()

    policy = ReplayPolicy(max_attempts=10, backoff_base=0.05, backoff_cap=0.5)
    try:
        with ClusterClient(addresses) as client:
            pipeline = SourcePipeline(spark, client, shared / "checkpoint", policy=policy)
            stats = pipeline.run(spark.read.text(str(shared / "in")), job)
        # The block managers of the driver and of every executor, as "host:port".
        block_managers = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().keys().mkString(",").split(",")
    finally:
        close_clients()
        spark.stop()
    result = {
        "stats": stats.as_dict(),
        "driver_host": socket.gethostname(),
        "driver_address": address,
        "block_managers": block_managers,
        "seconds": time.monotonic() - started,
    }
    (shared / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
