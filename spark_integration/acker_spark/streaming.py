"""A Structured Streaming source that is a spout: ``spark.readStream.format("acker_spout").load(directory)``.

Built on PySpark 4's Python Data Source API (needs pyarrow: ``pip install
pyspark-acker[streaming]``; this module itself imports without it). Records
never pass through Spark's planning process: a micro-batch's partitions name
byte ranges of the directory's files and the identities of records to replay
(:mod:`acker_spark.stream_source`); the executor task that reads them starts
their trees, column-wise, with roots derived from (run, identity, attempt),
and logs the roots to the emission log in the ``checkpoint`` directory. The
planning side (:class:`~acker_spark.stream_planner.StreamPlanner`) only
subscribes to the outcomes, settles them by root in bulk and plans replays,
so records in flight survive a restart of the query from its checkpoints.

Each micro-batch holds rows ``key``, ``value``, ``attempt``, ``_acker_ids``,
the columns ``GuaranteedPipeline.run(..., as_dataframe=True)`` hands a job, so
``foreachBatch`` can run ``ArrowBolt`` or ``Bolt.apply_df`` on them. The old
driver-fed mode (option ``generated``) lives in :mod:`acker_spark.stream_memory`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from acker_protocol.credentials import ChannelSecurity
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxBytes, ReadMaxFiles, SupportsTriggerAvailableNow

from .replays import ReplayPolicy

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


@dataclass(frozen=True)
class StreamOptions:
    """The source's options, parsed from the strings Spark passes."""

    ackers: tuple[str, ...]
    database: str
    path: str | None = None
    checkpoint: str | None = None
    generated: int | None = None  # the driver-fed mode (acker_spark.stream_memory)
    seed: int = 42
    name: str | None = None
    max_pending: int = 100_000
    max_bytes_per_batch: int = 64 << 20
    split_bytes: int = 16 << 20
    partitions: int = 2
    policy: ReplayPolicy = ReplayPolicy()
    spout_timeout: float | None = None
    security: ChannelSecurity | None = None  # options tls_ca, tls_cert, tls_key, token_file, server_name

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        """Validate ``options``; raise ValueError naming the option that is wrong."""
        opts = {k.lower(): v for k, v in options.items()}  # Spark's option keys are case-insensitive
        ackers = tuple(a.strip() for a in opts.get("ackers", "").split(",") if a.strip())
        if not ackers:
            raise ValueError('option "ackers" is required: the acker addresses in shard order, comma-separated')
        if "database" not in opts:
            raise ValueError('option "database" is required: the SQLite file for dead letters')
        path, generated = opts.get("path"), _int(opts, "generated", None)
        if (path is None) == (generated is None):
            raise ValueError('give exactly one record source: load(<directory>) / option "path", or "generated"')
        if path is not None and not opts.get("checkpoint"):
            raise ValueError(
                'option "checkpoint" is required: a directory the planner and every executor can write, for the'
                " stream's emission log, outcome journal and replay plans (one per query, kept with its"
                " checkpointLocation)"
            )
        policy = ReplayPolicy(
            max_attempts=_int(opts, "max_attempts", 5),
            backoff_base=_float(opts, "backoff_base", 0.5),
            backoff_factor=_float(opts, "backoff_factor", 2.0),
            backoff_cap=_float(opts, "backoff_cap", 30.0),
        )
        parsed = cls(
            ackers=ackers,
            database=opts["database"],
            path=path,
            checkpoint=opts.get("checkpoint"),
            generated=generated,
            seed=_int(opts, "seed", 42),
            name=opts.get("name"),
            max_pending=_int(opts, "max_pending", 100_000 if path is not None else 1_000),
            max_bytes_per_batch=_int(opts, "max_bytes_per_batch", 64 << 20),
            split_bytes=_int(opts, "split_bytes", 16 << 20),
            partitions=max(1, _int(opts, "partitions", 2)),
            policy=policy,
            spout_timeout=_float(opts, "spout_timeout", None) if "spout_timeout" in opts else None,
            security=_security(opts),
        )
        for key in ("max_pending", "max_bytes_per_batch", "split_bytes"):
            if getattr(parsed, key) < 1:
                raise ValueError(f"option {key!r} must be at least 1, got {getattr(parsed, key)}")
        return parsed


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


def _float(opts: Mapping[str, str], key: str, default: float | None) -> Any:
    try:
        return float(opts[key]) if key in opts else default
    except ValueError:
        raise ValueError(f"option {key!r} must be a number, got {opts[key]!r}") from None


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

            from .stream_planner import PlannerOptions, StreamPlanner

            opts = self.options
            assert opts.path is not None and opts.checkpoint is not None
            cluster = ClusterClient(list(opts.ackers), security=opts.security)
            try:
                self._planner = StreamPlanner(
                    PlannerOptions(
                        directory=opts.path,
                        checkpoint=opts.checkpoint,
                        database=opts.database,
                        addresses=opts.ackers,
                        name=opts.name,
                        max_pending=opts.max_pending,
                        max_bytes_per_batch=opts.max_bytes_per_batch,
                        split_bytes=opts.split_bytes,
                        partitions=opts.partitions,
                        policy=opts.policy,
                        security=opts.security,
                        spout_timeout=opts.spout_timeout,
                    ),
                    cluster,
                )
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
        options = StreamOptions.parse(self.options)
        if options.generated is not None:
            from .stream_memory import MemorySpoutStreamReader

            return MemorySpoutStreamReader(options)
        return AckerSpoutStreamReader(options)


def register_acker_spout(spark: Any) -> None:
    """Make ``format("acker_spout")`` available in ``spark``."""
    spark.dataSource.register(AckerSpoutDataSource)
