"""A Structured Streaming source that is a spout: ``spark.readStream.format("acker_spout")``.

Built on PySpark 4's Python Data Source API (needs pyarrow: ``pip install
pyspark-acker[streaming]``; this module itself imports without it). Spark runs
the reader's planning calls in a long-lived Python process of its own: there
:meth:`AckerSpoutStreamReader.latestOffset` starts one tuple tree per record
(through :class:`~acker_spark.stream_spout.StreamSpout`), and each micro-batch
holds rows ``key``, ``value``, ``attempt``, ``_acker_ids``, the same columns
``GuaranteedPipeline.run(..., as_dataframe=True)`` hands a job, so
``foreachBatch`` can run ``Bolt.apply_df`` on them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from acker_protocol.credentials import ChannelSecurity
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from .replays import ReplayPolicy
from .stream_spout import Row, StreamSpout

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
"""The stream's columns: the record, which delivery of it this is (1 = first), its packed MessageId."""

# How long latestOffset waits, under Trigger.AvailableNow, for the outcome of
# trees in flight before answering again (it loops until every record settled).
_AVAILABLE_NOW_POLL = 1.0


@dataclass(frozen=True)
class StreamOptions:
    """The source's options, parsed from the strings Spark passes."""

    ackers: tuple[str, ...]
    database: str
    path: str | None = None
    generated: int | None = None
    seed: int = 42
    name: str | None = None
    max_pending: int = 1_000
    partitions: int = 2
    policy: ReplayPolicy = ReplayPolicy()
    security: ChannelSecurity | None = None  # options tls_ca, tls_cert, tls_key, token_file, server_name

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        """Validate ``options``; raise ValueError naming the option that is wrong."""
        opts = {k.lower(): v for k, v in options.items()}  # Spark's option keys are case-insensitive
        ackers = tuple(a.strip() for a in opts.get("ackers", "").split(",") if a.strip())
        if not ackers:
            raise ValueError('option "ackers" is required: the acker addresses in shard order, comma-separated')
        if "database" not in opts:
            raise ValueError('option "database" is required: the SQLite file for dead letters and progress')
        path, generated = opts.get("path"), _int(opts, "generated", None)
        if (path is None) == (generated is None):
            raise ValueError('give exactly one record source: load(<directory>) / option "path", or "generated"')
        policy = ReplayPolicy(
            max_attempts=_int(opts, "max_attempts", 5),
            backoff_base=_float(opts, "backoff_base", 0.5),
            backoff_factor=_float(opts, "backoff_factor", 2.0),
            backoff_cap=_float(opts, "backoff_cap", 30.0),
        )
        return cls(
            ackers=ackers,
            database=opts["database"],
            path=path,
            generated=generated,
            seed=_int(opts, "seed", 42),
            name=opts.get("name"),
            max_pending=_int(opts, "max_pending", 1_000),
            partitions=max(1, _int(opts, "partitions", 2)),
            policy=policy,
            security=_security(opts),
        )


def _security(opts: Mapping[str, str]) -> ChannelSecurity | None:
    """TLS / token options, or None when none is given (plaintext)."""
    keys = ("tls_ca", "tls_cert", "tls_key", "token_file", "server_name")
    given = {key: opts[key] for key in keys if opts.get(key)}
    if not given:
        return None
    return ChannelSecurity(tls=True, **given)


def _int(opts: Mapping[str, str], key: str, default: int | None) -> Any:
    try:
        return int(opts[key]) if key in opts else default
    except ValueError:
        raise ValueError(f"option {key!r} must be an integer, got {opts[key]!r}") from None


def _float(opts: Mapping[str, str], key: str, default: float) -> float:
    try:
        return float(opts[key]) if key in opts else default
    except ValueError:
        raise ValueError(f"option {key!r} must be a number, got {opts[key]!r}") from None


class RowsPartition(InputPartition):
    """One slice of a micro-batch: its rows travel with the partition to the executor."""

    def __init__(self, rows: Sequence[Row]) -> None:
        super().__init__(list(rows))


class AckerSpoutStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
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


class AckerSpoutDataSource(DataSource):
    """``spark.readStream.format("acker_spout")``: records from a directory (``load(path)``) or generated."""

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
