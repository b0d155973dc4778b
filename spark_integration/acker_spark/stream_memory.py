"""The ``acker_spout`` source's driver-fed mode (option ``generated``): records made in Spark's planning process.

Kept for compatibility and tests only; the documented source reads files on
the executors (:mod:`acker_spark.streaming`). Here Spark's planning process
holds every record: :meth:`MemorySpoutStreamReader.latestOffset` starts one
tuple tree per record (through :class:`~acker_spark.stream_spout.StreamSpout`),
and each micro-batch's partitions carry their rows to the executors. Records
in flight are lost when the query stops.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from .stream_options import StreamOptions
from .stream_spout import Row, StreamSpout

__all__ = ["MemorySpoutStreamReader", "RowsPartition"]

# How long latestOffset waits, under Trigger.AvailableNow, for the outcome of
# trees in flight before answering again (it loops until every record settled).
_AVAILABLE_NOW_POLL = 1.0


class RowsPartition(InputPartition):
    """One slice of a micro-batch: its rows travel with the partition to the executor."""

    def __init__(self, rows: Sequence[Row]) -> None:
        super().__init__(list(rows))


class MemorySpoutStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from a :class:`StreamSpout` created on first use in Spark's planning process.

    Spark also ships this object to executors for :meth:`read`, so it holds only
    the options until a planning call needs the spout.
    """

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._spout: StreamSpout | None = None
        self._available_now = False

    def __getstate__(self) -> dict[str, Any]:
        # Executors need only the options; a spout never leaves its process.
        return {"options": self.options, "_spout": None, "_available_now": False}

    def spout(self) -> StreamSpout:
        """This reader's spout, connected on first use."""
        if self._spout is None:
            from acker_client import ClusterClient

            from .sources import generated_sentences
            from .stream_spout import DirectoryFeed

            opts = self.options
            feed = DirectoryFeed(opts.path) if opts.path else generated_sentences(opts.generated or 0, seed=opts.seed)
            cluster = ClusterClient(list(opts.ackers), security=opts.security)
            try:
                spout = StreamSpout(
                    cluster,
                    feed,
                    database=opts.database,
                    name=opts.name,
                    max_pending=opts.max_pending,
                    policy=opts.policy,
                )
                self._spout = spout.start()
            except BaseException:
                cluster.close()
                raise
        return self._spout

    def initialOffset(self) -> dict:
        """Offset 0: a new query starts with an empty log."""
        return {"offset": 0}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Start trees for due replays and new records; the end offset of what was emitted."""
        spout = self.spout()
        if spout.end < start["offset"]:
            spout.rebase(start["offset"])  # a restarted query: continue its numbering
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = spout.advance(max_rows)
        # Under AvailableNow an unchanged offset ends the query: do not answer that
        # while records are in flight or waiting for a replay.
        while self._available_now and end == start["offset"] and spout.busy():
            spout.wait_for_work(_AVAILABLE_NOW_POLL)
            end = spout.advance(max_rows)
        return {"offset": end}

    def prepareForTriggerAvailableNow(self) -> None:
        """Read only the records present now, and run until each of them is settled."""
        self._available_now = True
        self.spout().freeze()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """The rows between the offsets, in up to ``partitions`` contiguous slices."""
        rows = self.spout().rows(start["offset"], end["offset"])
        count = min(self.options.partitions, len(rows))
        bounds = [len(rows) * i // count for i in range(count + 1)] if count else []
        return [RowsPartition(rows[lo:hi]) for lo, hi in zip(bounds, bounds[1:], strict=False)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """The partition's rows (runs in an executor)."""
        return iter(partition.value)

    def commit(self, end: dict) -> None:
        """Spark has processed everything before ``end``: forget those rows."""
        self.spout().commit(end["offset"])

    def stop(self) -> None:
        """Close the spout and its client (the query stopped)."""
        spout, self._spout = self._spout, None
        if spout is not None:
            try:
                spout.close()
            finally:
                spout.cluster.close()
