"""The driver of ``acker-bench --mode exactly-once``: SourcePipeline runs in a process of its own.

``python -m acker_bench.exactly_once_driver CONFIG_JSON`` reads the keyed
source (Parquet, ``id`` and ``text``), splits each record's text into words
with an :class:`~acker_spark.steps.arrow_bolt.ArrowBolt` and returns the word rows
``(id, word, bucket, attempt)`` as the job's output, so the pipeline stages,
acks and commits them exactly once: into a Parquet folder partitioned by
``bucket`` (``FileOutput``), then, in a second pipeline over the same source
with its own checkpoint, into a catalog table (``TableOutput``). ``attempt`` is
the ``_attempt`` of the delivery that produced the row: the bench checks that
each record's rows come from one delivery.

The bench kills this process (and its JVM and Python workers) with ``kill -9``
and starts it again with the same configuration: the checkpoints make the new
driver finish both runs (a finished one only finishes its commit). A table's
catalog must outlive a killed driver, so Spark runs with the Hive catalog in an
embedded Derby metastore under the bench's folder: local Spark's default
in-memory catalog forgets the table with the process, and ``saveAsTable`` in
the next driver would then refuse the table's non-empty location. When both
runs end the driver reads each destination back with Spark
(``spark.read.parquet``, ``spark.table``) into a dump for the bench to compare
with the expected rows, and prints the runs' stats as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["OUTPUT_SCHEMA", "TABLE", "DriverConfig", "SinkPaths", "session_conf", "sink_paths", "split_words"]

OUTPUT_SCHEMA = "id string, word string, bucket string, attempt int"
"""The job's output rows: one per word of a record, with the delivery (``_attempt``) that produced it."""


TABLE = "acker_bench_words"
"""The catalog table the table sink writes (in the bench folder's own metastore)."""


@dataclass(frozen=True)
class DriverConfig:
    """Everything a driver run needs; the same for a driver and the one restarted after its kill.

    Each sink (``"parquet"``, ``"table"``) is a pipeline of its own, run one
    after the other over the same source, with its own checkpoint and
    dead-letter store under ``work`` (:func:`sink_paths`).
    """

    addresses: tuple[str, ...]
    work: str  # the bench's folder: source, checkpoints, outputs, catalog, dumps
    sinks: tuple[str, ...] = ("parquet", "table")
    master: str = "local[2]"
    batch_rows: int = 1000
    max_attempts: int = 6
    # Tasks per job: a bolt hands its rows on when its partition is done, so the staged rows (the
    # bench's progress) grow task by task; the few small source files in one task each would
    # stage everything at once.
    tasks: int = 32
    # "rewrite" or "publish": this driver kills itself (kill -9 of its process group) when its Parquet
    # commit first reads a staged file back to rewrite it, or after it has moved one file into place.
    # "rewrite" also fails some records on their first delivery, so that files hold rows to leave out.
    die_at: str = ""

    def to_json(self) -> str:
        """The configuration as the driver's one command-line argument."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DriverConfig:
        """The configuration :meth:`to_json` wrote."""
        data = json.loads(text)
        data["addresses"], data["sinks"] = tuple(data["addresses"]), tuple(data["sinks"])
        return cls(**data)


@dataclass(frozen=True)
class SinkPaths:
    """Where one sink's pipeline keeps its state and output under the bench's folder."""

    checkpoint: Path
    destination: str  # the Parquet folder, or the table's name
    dump: Path  # the finished run's destination rows, read back with Spark
    dead_letters: Path


def source_path(work: str | Path) -> Path:
    """The keyed source (Parquet files of ``id``, ``text``)."""
    return Path(work) / "source"


def catalog_path(work: str | Path) -> Path:
    """The Derby metastore and warehouse of the table sink."""
    return Path(work) / "catalog"


def sink_paths(work: str | Path, sink: str) -> SinkPaths:
    """The paths of sink ``sink`` (``"parquet"`` or ``"table"``)."""
    root = Path(work)
    destination = str(root / "out-parquet") if sink == "parquet" else TABLE
    return SinkPaths(root / f"checkpoint-{sink}", destination, root / f"dump-{sink}", root / f"dead-{sink}.sqlite")


def split_words(batch: pa.RecordBatch, collector: Any) -> None:
    """Emit one ``(id, word, bucket, attempt)`` row per word of ``text``, anchored to its record."""
    pieces = pc.split_pattern(batch.column("text"), " ")
    parents = pc.list_parent_indices(pieces)
    ids = pc.take(batch.column("id"), parents)
    collector.emit(
        {
            "id": ids,
            "word": pc.list_flatten(pieces),
            "bucket": pc.utf8_slice_codeunits(ids, 7, 8),  # the id's last digit: 10 partitions
            "attempt": pc.take(batch.column("_attempt"), parents),
        },
        anchors=parents,
    )


@dataclass(frozen=True)
class FlakyWords:
    """:func:`split_words`, failing on their first delivery the records whose id's tens digit is ``tens``.

    Their words sit in the same ``bucket`` folders as other records' (the bucket is the last
    digit), so the first delivery's files hold rows the commit must leave out.
    """

    tens: str = "3"

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        """Split, then fail the chosen records of a first delivery."""
        split_words(batch, collector)
        first = pc.equal(batch.column("_attempt"), 1)
        chosen = pc.equal(pc.utf8_slice_codeunits(batch.column("id"), 6, 7), self.tens)
        collector.fail(np.flatnonzero(pc.and_(first, chosen).to_numpy(zero_copy_only=False)))


def _die_at(point: str) -> None:
    """Kill this driver (its whole process group, as ``kill -9`` of it would) at a point of its Parquet commit."""
    from acker_spark.output import folder_publish, publish

    def die(_path: Any) -> None:
        os.killpg(os.getpgrp(), signal.SIGKILL)

    if point == "rewrite":
        publish.READS.append(die)
    elif point == "publish":
        moved: list[Any] = []

        def die_after_one(path: Any) -> None:
            if moved:
                die(path)
            moved.append(path)

        folder_publish.MOVES.append(die_after_one)
    else:
        raise ValueError(f"die_at must be rewrite or publish, not {point!r}")


def session_conf(config: DriverConfig) -> dict[str, str]:
    """Spark settings of the run: small Arrow batches (kills land mid-task), Hive catalog for the table sink."""
    conf = {"spark.sql.execution.arrow.maxRecordsPerBatch": str(config.batch_rows)}
    if "table" in config.sinks:
        catalog = catalog_path(config.work)
        # The in-memory catalog dies with the driver: a restarted one would not find the table a
        # killed one created (and saveAsTable would refuse its non-empty location).
        conf.update(
            {
                "spark.sql.catalogImplementation": "hive",
                "spark.sql.warehouse.dir": str(catalog / "warehouse"),
                "spark.hadoop.javax.jdo.option.ConnectionURL": (
                    f"jdbc:derby:;databaseName={catalog / 'metastore_db'};create=true"
                ),
            }
        )
    return conf


def run(config: DriverConfig) -> dict[str, Any]:
    """Run (or finish) each sink's pipeline, then write its destination's rows to its dump; the runs' stats."""
    from acker_client import ClusterClient
    from acker_spark import ArrowBolt, ReplayPolicy, close_clients, local_session
    from acker_spark.dead_letter import DeadLetterStore
    from acker_spark.executor_read.source_pipeline import SourcePipeline
    from acker_spark.output import FileOutput, TableOutput

    if config.die_at:
        _die_at(config.die_at)
    spark = local_session(config.master, app_name="acker-bench-exactly-once", extra_conf=session_conf(config))
    policy = ReplayPolicy(max_attempts=config.max_attempts, backoff_base=0.1, backoff_cap=1.0)
    results: dict[str, Any] = {}
    if "table" in config.sinks:
        # A driver started after one was killed during the table's commit must find the table it created.
        results["table_found_at_start"] = spark.catalog.tableExists(TABLE)
    with ClusterClient(config.addresses) as client:
        for sink in config.sinks:
            paths = sink_paths(config.work, sink)
            output: Any
            if sink == "parquet":
                output = FileOutput(paths.destination, partition_by=["bucket"])
            else:
                output = TableOutput(paths.destination, partition_by=["bucket"])
            function = FlakyWords() if config.die_at == "rewrite" else split_words
            bolt = ArrowBolt(function, config.addresses, schema=OUTPUT_SCHEMA, name=f"split-{sink}")
            pipeline = SourcePipeline(
                spark,
                client,
                paths.checkpoint,
                policy=policy,
                dead_letters=DeadLetterStore(paths.dead_letters),
                output=output,
            )
            source = spark.read.parquet(str(source_path(config.work))).repartition(config.tasks, "id")
            results[sink] = pipeline.run(source, bolt.apply_df, key="id").as_dict()
    close_clients()
    for sink in config.sinks:
        paths = sink_paths(config.work, sink)
        written = spark.read.parquet(paths.destination) if sink == "parquet" else spark.table(paths.destination)
        # Spark infers a partition folder's values (bucket=3) as numbers: compared as the text the job wrote.
        written = written.selectExpr("id", "word", "CAST(bucket AS STRING) AS bucket", "attempt")
        for attempt in range(3):  # the bench may kill a Python worker of this job too
            try:
                written.write.mode("overwrite").parquet(str(paths.dump))
                break
            except Exception:  # noqa: BLE001 - a failed job: write the dump again
                if attempt == 2:
                    raise
    spark.stop()
    return results


def main() -> None:
    """``python -m acker_bench.exactly_once_driver CONFIG_JSON``: print the runs' stats as one JSON line."""
    print(json.dumps(run(DriverConfig.from_json(sys.argv[1]))), flush=True)


if __name__ == "__main__":
    main()
