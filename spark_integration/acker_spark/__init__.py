"""Spark integration for the acker service: tracked bolts over RDDs and DataFrames, a replaying driver spout.

Typical use::

    from acker_spark import Bolt, GuaranteedPipeline, DeadLetterStore
    split = Bolt(split_fn, addresses, name="split")    # emits children anchored to each input, acks it
    store = Bolt(write_fn, addresses, name="store")    # writes its rows idempotently, then acks them
    pipeline = GuaranteedPipeline(spark, ClusterClient(addresses), dead_letters=DeadLetterStore(db))
    stats = pipeline.run(records, lambda rdd: store.apply(split.apply(rdd)).count())

DataFrames: ``pipeline.run(records, job, as_dataframe=True)`` and ``bolt.apply_df(df, schema)``
(see :mod:`acker_spark.frames`). Test helpers: :mod:`acker_spark.testing`.
"""

from .dead_letter import DeadLetter, DeadLetterStore
from .executor import Bolt, BoltFunction, UntrackedCollector, client_for, close_clients
from .frames import TRACKING_COLUMN, pack_ids, unpack_ids
from .ids import DeterministicEdgeIds, dedup_key, stable_id
from .pipeline import ACKED, GuaranteedPipeline, Job, PipelineStats, ReplayPolicy, run_untracked
from .session import LOCAL_MASTER, local_session
from .sources import Delivery, Record, TextDirectorySource, generated_sentences, records_from

__all__ = [
    "ACKED",
    "Bolt",
    "BoltFunction",
    "DeadLetter",
    "DeadLetterStore",
    "Delivery",
    "DeterministicEdgeIds",
    "GuaranteedPipeline",
    "Job",
    "LOCAL_MASTER",
    "PipelineStats",
    "Record",
    "ReplayPolicy",
    "TRACKING_COLUMN",
    "TextDirectorySource",
    "UntrackedCollector",
    "client_for",
    "close_clients",
    "dedup_key",
    "generated_sentences",
    "local_session",
    "pack_ids",
    "records_from",
    "run_untracked",
    "stable_id",
    "unpack_ids",
]
