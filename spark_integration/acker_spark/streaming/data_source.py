"""A Structured Streaming source that is a spout: ``spark.readStream.format("acker_spout").load(directory)``.

Built on PySpark 4's Python Data Source API (needs pyarrow: ``pip install
pyspark-acker[streaming]``; this module itself imports without it). Records
never pass through Spark's planning process: a micro-batch's partitions name
byte ranges of the directory's files and the identities of records to replay
(:mod:`acker_spark.streaming.stream_source`); the executor task that reads them starts
their trees, column-wise, with roots derived from (run, identity, attempt),
and logs the roots to the emission log in the ``checkpoint`` directory. The
planning side (:class:`~acker_spark.streaming.stream_planner.StreamPlanner`) only
subscribes to the outcomes, settles them by root in bulk and plans replays,
so records in flight survive a restart of the query from its checkpoints.

Each micro-batch holds rows ``key``, ``value``, ``attempt``, ``_acker_ids``, so
``foreachBatch`` can run ``ArrowBolt`` or ``Bolt.apply_df`` on them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxBytes, ReadMaxFiles, SupportsTriggerAvailableNow

from .stream_options import StreamOptions

__all__ = [
    "FORMAT",
    "SCHEMA",
    "StreamOptions",
    "AckerSpoutDataSource",
    "AckerSpoutStreamReader",
    "register_acker_spout",
]

FORMAT = "acker_spout"
"""The format name to pass to ``spark.readStream.format``."""

SCHEMA = "key string, value string, attempt int, _acker_ids binary"
"""The stream's columns: the record's identity (``file@byte``), its line, which delivery (1 = first), its MessageId."""


class AckerSpoutStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches of source coordinates; :meth:`read` reads them and starts the trees (in executors).

    Spark ships this object to executors for :meth:`read`, so it holds only the
    options until a planning call creates the planner (in Spark's planning process).
    """

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._planner: Any = None
        self._available_now = False

    def __getstate__(self) -> dict[str, Any]:
        # Executors need only the options; the planner (subscriptions, table) never leaves its process.
        return {"options": self.options, "_planner": None, "_available_now": False}

    def planner(self) -> Any:
        """This reader's planner, created (and its state restored from the checkpoint) on first use."""
        if self._planner is None:
            from acker_client import ClusterClient

            from .stream_planner import StreamPlanner

            opts = self.options
            cluster = ClusterClient(list(opts.ackers), security=opts.security)
            try:
                self._planner = StreamPlanner(opts, cluster)
            except BaseException:
                cluster.close()
                raise
        return self._planner

    def initialOffset(self) -> dict:
        """Micro-batch 0 at the start of the first file."""
        from .stream_planner import initial_offset

        return initial_offset()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Settle what the last micro-batch started; the next one's end: due replays and new bytes."""
        max_files = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        return self.planner().latest(start, max_files=max_files, max_bytes=max_bytes, wait=self._available_now)

    def prepareForTriggerAvailableNow(self) -> None:
        """Read only the files present now, and run until each of their records is settled."""
        self._available_now = True
        self.planner().freeze()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """Byte ranges of the new data and the identities to replay: coordinates, no record."""
        return self.planner().partitions(start, end, self.options.ackers, {})

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Read the partition's records, start their trees, yield them as Arrow batches (runs in an executor)."""
        from .stream_source import read_partition

        return read_partition(partition)  # type: ignore[arg-type]

    def commit(self, end: dict) -> None:
        """Nothing to drop: the planner holds no record (outcomes are settled in :meth:`latestOffset`)."""

    def stop(self) -> None:
        """Close the outcome streams and the client (the query stopped)."""
        planner, self._planner = self._planner, None
        if planner is not None:
            try:
                planner.close()
            finally:
                planner.cluster.close()


class AckerSpoutDataSource(DataSource):
    """``spark.readStream.format("acker_spout")``: the lines of a directory's files (``load(path)``)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return FORMAT

    def schema(self) -> str:
        """The fixed columns of the stream."""
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        """A reader for the options given (validated here, so a bad option fails the query at start)."""
        return AckerSpoutStreamReader(StreamOptions.parse(self.options))


def register_acker_spout(spark: Any) -> None:
    """Make ``format("acker_spout")`` available in ``spark``."""
    spark.dataSource.register(AckerSpoutDataSource)
