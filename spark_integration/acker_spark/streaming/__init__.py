"""A Structured Streaming source that is a spout: ``spark.readStream.format("acker_spout").load(directory)``.

:mod:`.data_source` (the data source and its stream reader; needs PySpark 4
and pyarrow), :mod:`.stream_source` (the partitions and the executors' read)
and :mod:`.stream_options` (the options). The planning side is an
executor-read driver, :mod:`acker_spark.executor_read.stream_planner`, and the
way back from ``foreachBatch`` is
:func:`acker_spark.executor_read.stream_undelivered.record_commit_errors`
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

__all__ = [
    "FORMAT",
    "SCHEMA",
    "AckerSpoutDataSource",
    "AckerSpoutStreamReader",
    "StreamOptions",
    "register_acker_spout",
]
