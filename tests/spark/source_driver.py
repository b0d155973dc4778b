"""A SourcePipeline driver in a process of its own, for the kill -9 test (test_source_restart.py).

Usage: source_driver.py ADDRESSES INPUT_DIR CHECKPOINT DB RUN

Reads INPUT_DIR with spark.read.text and runs a word count whose sink writes
each word (idempotently, keyed by record and position) and appends one
``writes`` row per (record, root, driver run) so the test can tell which
driver processed which delivery. The sink is slow on purpose: the test kills
this process while the first job runs. Prints the run's stats as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pyarrow as pa


def main() -> None:
    addresses, source, checkpoint, db, run = sys.argv[1:6]
    from acker_client import ClusterClient
    from acker_demo.dataframe_job import WORD_SCHEMA, split_sentences
    from acker_spark import ReplayPolicy, local_session
    from acker_spark.executor_read.source_pipeline import SourcePipeline
    from acker_spark.sqlite import open_db, upsert
    from acker_spark.steps.arrow_bolt import ArrowBolt

    with open_db(db) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS writes (record_key TEXT, root TEXT, run INTEGER)")

    def sink(batch: pa.RecordBatch, collector: Any) -> None:
        columns = batch.to_pydict()
        keys = [k.split("|") for k in columns["key"]]
        if run == "1":
            time.sleep(0.1)  # the first driver is slow enough for the test to kill it mid-job; the second is not
        with open_db(db) as conn:
            upsert(conn, "words", ("record_key", "position", "word"), [
                (k, p, w) for (k, _), p, w in zip(keys, columns["position"], columns["word"])
            ])  # fmt: skip
            conn.executemany("INSERT INTO writes VALUES (?, ?, ?)", sorted({(k, r, int(run)) for k, r in keys}))
        # Returning acks every row: written first, then acked.

    names = addresses.split(",")
    split = ArrowBolt(split_sentences, names, schema=WORD_SCHEMA, name="split")
    count = ArrowBolt(sink, names, schema=None, name="count")

    def job(df: Any) -> None:
        keyed = df.selectExpr(
            "concat(_record_key, '|', hex(substring(_acker_ids, 1, 8))) AS key",
            "value",
            "_attempt AS attempt",
            "_acker_ids",
        )
        count.apply_df(split.apply_df(keyed).repartition(8, "word")).count()

    spark = local_session("local[2]", app_name="acker-source-driver", shuffle_partitions=8)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    with ClusterClient(names) as client:
        policy = ReplayPolicy(max_attempts=5, backoff_base=0.05, backoff_cap=0.2)
        stats = SourcePipeline(spark, client, checkpoint, policy=policy).run(spark.read.text(source), job)
    spark.stop()
    print(json.dumps(stats.as_dict()))


if __name__ == "__main__":
    main()
