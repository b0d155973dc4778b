"""Exactly-once output from the acker_spout streaming source: StreamOutput in foreachBatch, also across a restart."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from acker_client.testing import local_cluster
from acker_spark import ArrowBolt, close_clients
from acker_spark.output import FileOutput, StreamOutput
from acker_spark.streaming import FORMAT, register_acker_spout
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException

pytest.importorskip("pyarrow")
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

DEADLINE = 120.0  # a hang guard for a query, not a speed check


class SplitWords:
    """Splits each line into (key, word, attempt) rows; fails lines containing ``flaky`` on their first delivery."""

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        pieces = pc.split_pattern(batch.column("value"), " ")
        parents = pc.list_parent_indices(pieces)
        collector.emit(
            {
                "key": pc.take(batch.column("key"), parents),
                "word": pc.list_flatten(pieces),
                "attempt": pc.take(batch.column("attempt"), parents),
            },
            anchors=parents,
        )
        flaky = np.array(["flaky" in v for v in batch.column("value").to_pylist()], dtype=bool)
        collector.fail(np.flatnonzero(flaky & (batch.column("attempt").to_numpy() == 1)))


class Stop(RuntimeError):
    """Stops the first query after its first micro-batch's output was written."""


def write_file(folder: Path, name: str, lines: list[str]) -> None:
    """A complete text file put in place by a rename (the source's rule)."""
    tmp = folder.parent / f".{name}.tmp"
    tmp.write_text("".join(f"{line}\n" for line in lines))
    tmp.rename(folder / name)


def run_query(spark: Any, source: Path, tmp_path: Path, addresses: Any, job: Any) -> Any:
    """An availableNow acker_spout query over ``source`` with ``job`` as its foreachBatch; returns it ended."""
    query = (
        spark.readStream.format(FORMAT)
        .option("ackers", ",".join(addresses))
        .option("checkpoint", str(tmp_path / "acker-checkpoint"))
        .option("database", str(tmp_path / "dead.sqlite"))
        .option("max_attempts", "3")
        .option("backoff_base", "0.1")
        .option("max_bytes_per_batch", "200")
        .load(str(source))
        .writeStream.foreachBatch(job)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.awaitTermination(DEADLINE)
    finally:
        query.stop()
    return query


def test_streamed_output_is_exact_with_replays_and_a_restart(spark: Any, tmp_path: Path) -> None:
    """Replayed lines and a query stopped after its first micro-batch's commit: each line's words are in the
    Parquet output once, from the one delivery that ACKED."""
    source = tmp_path / "in"
    source.mkdir()
    lines = [f"line{i} {'flaky ' if i % 4 == 0 else ''}word{i} end" for i in range(40)]
    write_file(source, "a.txt", lines[:20])
    write_file(source, "b.txt", lines[20:])
    register_acker_spout(spark)
    out_dir = tmp_path / "out"
    with local_cluster(3, message_timeout=60.0) as ackers:
        bolt = ArrowBolt(SplitWords(), ackers.addresses, schema="key string, word string, attempt int", name="words")
        output = StreamOutput(
            FileOutput(str(out_dir), partition_by=["attempt"]), tmp_path / "acker-checkpoint", ackers.addresses
        )
        batches: list[int] = []

        def stopping(df: Any, batch_id: int) -> None:
            output.write(bolt.apply_df(df), batch_id)
            batches.append(batch_id)
            raise Stop("stopped after the first micro-batch's output")

        with pytest.raises(StreamingQueryException, match="stopped after the first"):
            run_query(spark, source, tmp_path, ackers.addresses, stopping)
        assert batches == [0]

        def job(df: Any, batch_id: int) -> None:
            output.write(bolt.apply_df(df), batch_id)
            batches.append(batch_id)

        second = run_query(spark, source, tmp_path, ackers.addresses, job)
        assert second.exception() is None
        output.finish(spark)
        close_clients()
    assert batches[:2] == [0, 0]  # the stopped micro-batch ran again with its batch id
    committed = spark.read.parquet(str(out_dir)).collect()
    assert Counter(r["word"] for r in committed) == Counter(w for line in lines for w in line.split())
    attempts: dict[str, set[int]] = {}
    words_of: dict[str, list[str]] = {}
    for r in committed:
        attempts.setdefault(r["key"], set()).add(r["attempt"])
        words_of.setdefault(r["key"], []).append(r["word"])
    assert len(attempts) == len(lines) and all(len(a) == 1 for a in attempts.values())  # one delivery each
    flaky = {k for k, words in words_of.items() if "flaky" in words}
    assert len(flaky) == 10 and all(min(attempts[k]) > 1 for k in flaky)  # the failed first deliveries left out
