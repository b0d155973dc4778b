"""A Structured Streaming source that is a spout: ``spark.readStream.format("acker_spout").load(directory)``.

:mod:`.data_source` (the data source and its stream reader; needs PySpark 4
and pyarrow), :mod:`.stream_source` (the partitions and the executors' read)
and :mod:`.stream_options` (the options); :mod:`.queue_source` is the
``acker_queue`` source: the same stream over a broker's queue. The planning side is an
executor-read driver, :mod:`acker_spark.streaming.stream_planner`, and the
way back from ``foreachBatch`` is
:func:`acker_spark.streaming.stream_undelivered.record_commit_errors`
(both share the source pipeline's checkpoint and book).
"""

from .data_source import (
    FORMAT,
    SCHEMA,
    AckerSpoutDataSource,
    AckerSpoutStreamReader,
    StreamOptions,
    register_acker_spout,
)
from .queue_source import (
    QUEUE_FORMAT,
    AckerQueueDataSource,
    AckerQueueStreamReader,
    QueueOptions,
    register_acker_queue,
)

__all__ = [
    "FORMAT",
    "QUEUE_FORMAT",
    "AckerQueueDataSource",
    "AckerQueueStreamReader",
    "QueueOptions",
    "register_acker_queue",
    "SCHEMA",
    "AckerSpoutDataSource",
    "AckerSpoutStreamReader",
    "StreamOptions",
    "register_acker_spout",
]
