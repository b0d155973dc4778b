"""Spark integration for the acker service: tracked bolts over RDDs and DataFrames, a replaying driver spout.

Records read by Spark itself (``spark.read...``), each tree started in the executor that reads it,
replays by re-reading, a durable checkpoint::

    pipeline = SourcePipeline(spark, ClusterClient(addresses), "checkpoint/", dead_letters=DeadLetterStore(db))
    stats = pipeline.run(spark.read.parquet("in/"), job, key="id")   # or spark.read.text(dir), no key

Records fed from the driver (in-memory sources)::

    from acker_spark import Bolt, GuaranteedPipeline, DeadLetterStore
    split = Bolt(split_fn, addresses, name="split")    # emits children anchored to each input, acks it
    store = Bolt(write_fn, addresses, name="store")    # writes its rows idempotently, then acks them
    pipeline = GuaranteedPipeline(spark, ClusterClient(addresses), dead_letters=DeadLetterStore(db))
    stats = pipeline.run(records, lambda rdd: store.apply(split.apply(rdd)).count())

DataFrames (classic Spark and Spark Connect): ``pipeline.run(records, job, as_dataframe=True)``
with column-wise ``ArrowBolt(fn, addresses, schema=...).apply_df(df)`` steps (see
:mod:`acker_spark.steps.arrow_bolt`; needs pyarrow), or row functions with ``bolt.apply_df(df, schema)``.
Structured Streaming: ``register_acker_spout(spark)``, then ``spark.readStream.format("acker_spout")``
(see :mod:`acker_spark.streaming`; needs the ``[streaming]`` extra, pyarrow).
"""

from typing import Any

from .budget import BudgetExceeded, FailureBudget
from .dead_letter import DeadLetter, DeadLetterStore, Select
from .driver_fed.pipeline import GuaranteedPipeline, Job, run_untracked
from .executor_read.stream_undelivered import record_commit_errors
from .redrive import RedriveReport, RedriveUnfinished
from .replay_policy import ReplayPolicy
from .run_report import AcksUndelivered, PipelineStats, RecordsFailed, RunStats, RunStopped, ShardDown, SourceStats
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
    "UnstableIdentity": "executor_read.identity",
    "StreamOptions": "streaming.stream_options",
    "register_acker_spout": "streaming.data_source",
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


__all__ = [
    "AckerSpoutDataSource",
    "AcksUndelivered",
    "ArrowBolt",
    "ArrowCollector",
    "ArrowFunction",
    "BatchOutput",
    "Bolt",
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
    "GuaranteedPipeline",
    "Job",
    "LOCAL_MASTER",
    "PipelineStats",
    "RecordsFailed",
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
    "client_for",
    "close_clients",
    "commit_errors",
    "dedup_key",
    "generated_sentences",
    "local_session",
    "pack_ids",
    "record_commit_errors",
    "records_from",
    "register_acker_spout",
    "run_untracked",
    "stable_id",
    "unpack_ids",
]
