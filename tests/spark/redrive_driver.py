"""A redrive driver in a process of its own, for the kill -9 test (test_redrive_restart.py).

Usage: redrive_driver.py ADDRESSES STORE CHECKPOINT DB RUN

Redrives every dead letter of STORE (rows ``{"id", "amount"}``) through a job
whose sink appends ``(id, root, run)`` for each row it takes into DB's
``writes`` table, slowly, so that the test can kill this process mid-redrive.
Prints the redrive's report as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pyarrow as pa


def main() -> None:
    addresses, store, checkpoint, db, run = sys.argv[1:6]
    from acker_client import ClusterClient
    from acker_spark import ArrowBolt, DeadLetterStore, ReplayPolicy, local_session
    from acker_spark.executor_read.source_pipeline import SourcePipeline
    from acker_spark.sqlite import open_db

    with open_db(db) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS writes (id TEXT, root TEXT, run INTEGER)")

    def sink(batch: pa.RecordBatch, collector: Any) -> None:
        time.sleep(0.3)  # slow enough for the test to kill the driver mid-job
        rows = zip(batch.column("id").to_pylist(), batch.column("root").to_pylist())
        with open_db(db) as conn:
            conn.executemany("INSERT INTO writes VALUES (?, ?, ?)", [(i, r, int(run)) for i, r in rows])
        # Returning acks every row: written first, then acked.

    names = addresses.split(",")
    bolt = ArrowBolt(sink, names, schema=None, name="sink")

    def job(df: Any) -> None:
        rooted = df.selectExpr("id", "hex(substring(_acker_ids, 1, 8)) AS root", "_attempt", "_acker_ids")
        bolt.apply_df(rooted).count()

    spark = local_session("local[2]", app_name="acker-redrive-driver", shuffle_partitions=4)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    with ClusterClient(names) as client:
        policy = ReplayPolicy(max_attempts=5, backoff_base=0.05, backoff_cap=0.2)
        report = SourcePipeline(spark, client, checkpoint, policy=policy).redrive(DeadLetterStore(store), job)
    spark.stop()
    print(json.dumps(report.as_dict()))


if __name__ == "__main__":
    main()
