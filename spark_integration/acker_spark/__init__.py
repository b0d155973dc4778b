"""Spark integration for the acker service: tracked bolts over RDDs and DataFrames, one replaying batch driver.

Records read by Spark itself (``spark.read...``), each tree started in the executor that reads it,
replays by re-reading, a durable checkpoint::

    pipeline = SourcePipeline(spark, ClusterClient(addresses), "checkpoint/", dead_letters=DeadLetterStore(db))
    stats = pipeline.run(spark.read.parquet("in/"), job, key="id")   # or spark.read.text(dir), no key

In-memory records (``records_from(values)``, a list of ``Record``) go through the same
driver: copied once into the checkpoint, then read by Spark like any source. A job's
steps are column-wise ``ArrowBolt(fn, addresses, schema=...).apply_df(df)`` (see
:mod:`acker_spark.steps.arrow_bolt`; needs pyarrow) or row functions with
``Bolt(fn, addresses).apply_df(df, schema)``; ``Bolt.apply(tracked_rdd(df))`` runs one over an RDD.
Structured Streaming: ``register_acker_spout(spark)``, then ``spark.readStream.format("acker_spout")``
(see :mod:`acker_spark.streaming`; needs the ``[streaming]`` extra, pyarrow); over a Redis stream or
a RabbitMQ queue, ``register_acker_queue(spark)`` and ``format("acker_queue")``.
"""

from typing import Any

from . import moved_modules
from .budget import BudgetExceeded, FailureBudget
from .dead_letter import DeadLetter, DeadLetterStore, Select
from .redrive import RedriveRefused, RedriveReport, RedriveUnfinished
from .replay_policy import ReplayPolicy
from .run_report import AcksUndelivered, RecordsFailed, RunError, RunStats, RunStopped, ShardDown, SourceStats
from .session import LOCAL_MASTER, local_session
from .sources import Delivery, Record, TextDirectorySource, generated_sentences, records_from
from .steps.executor import (
    Bolt,
    BoltFunction,
    CommitErrors,
    UntrackedCollector,
    client_for,
    close_clients,
    commit_errors,
)
from .steps.frames import TRACKING_COLUMN, pack_ids, unpack_ids
from .steps.ids import DeterministicEdgeIds, dedup_key, stable_id
from .steps.rdd_rows import tracked_rdd

# Imported on first use: the streaming source imports pyspark.sql, and the Arrow bolts pyarrow,
# which `import acker_spark` does not.
_LAZY = {
    "ArrowBolt": "steps.arrow_bolt",
    "ArrowCollector": "steps.arrow_collector",
    "ArrowFunction": "steps.arrow_bolt",
    "RecordTimeLimit": "steps.time_limit",
    "AckerSpoutDataSource": "streaming.data_source",
    "DuplicateIdentity": "executor_read.source_pipeline",
    "SourcePipeline": "executor_read.source_pipeline",
    "PipelineOptions": "executor_read.pipeline_options",
    "UnstableIdentity": "tracking.identity",
    "WrongCheckpoint": "tracking.checkpoint",
    "JobWritesItself": "executor_read.job_check",
    "OutputForgotten": "executor_read.job_check",
    "OutputNotReturned": "executor_read.job_check",
    "record_commit_errors": "streaming.stream_undelivered",
    "StreamOptions": "streaming.stream_options",
    "register_acker_spout": "streaming.data_source",
    "register_acker_queue": "streaming.queue_source",
    "BatchOutput": "output",
    "FileOutput": "output",
    "StreamOutput": "output",
    "TableOutput": "output",
}


def __getattr__(name: str) -> Any:
    """Load the streaming source's names on first access."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


moved_modules.install()  # the old paths of modules that moved still import, with a warning naming the new one


__all__ = [
    "AckerSpoutDataSource",
    "AcksUndelivered",
    "ArrowBolt",
    "ArrowCollector",
    "ArrowFunction",
    "BatchOutput",
    "Bolt",
    "JobWritesItself",
    "OutputForgotten",
    "OutputNotReturned",
    "RedriveRefused",
    "RedriveReport",
    "RedriveUnfinished",
    "Select",
    "RecordTimeLimit",
    "BudgetExceeded",
    "BoltFunction",
    "CommitErrors",
    "DeadLetter",
    "DeadLetterStore",
    "Delivery",
    "FileOutput",
    "DeterministicEdgeIds",
    "DuplicateIdentity",
    "LOCAL_MASTER",
    "RecordsFailed",
    "RunError",
    "RunStats",
    "RunStopped",
    "ShardDown",
    "Record",
    "FailureBudget",
    "ReplayPolicy",
    "SourcePipeline",
    "SourceStats",
    "StreamOptions",
    "StreamOutput",
    "TRACKING_COLUMN",
    "TableOutput",
    "TextDirectorySource",
    "UnstableIdentity",
    "UntrackedCollector",
    "WrongCheckpoint",
    "client_for",
    "close_clients",
    "commit_errors",
    "dedup_key",
    "generated_sentences",
    "local_session",
    "pack_ids",
    "record_commit_errors",
    "records_from",
    "register_acker_queue",
    "register_acker_spout",
    "stable_id",
    "tracked_rdd",
    "unpack_ids",
]
