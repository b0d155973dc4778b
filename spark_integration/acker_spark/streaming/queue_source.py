"""A Structured Streaming source over a broker's queue: ``spark.readStream.format("acker_queue")``.

The ``acker_spout`` source (:mod:`.data_source`) over a spool the planner fills
from the broker (:class:`~acker_spark.queues.queue_planner.QueuePlanner`)::

    register_acker_queue(spark)
    out = StreamOutput(FileOutput("out/"), "acker-checkpoint", ADDRESSES)
    query = (
        spark.readStream.format("acker_queue")
        .option("redis", "redis://localhost:6379/0").option("stream", "orders").option("group", "words")
        .option("ackers", ",".join(ADDRESSES)).option("checkpoint", "acker-checkpoint")
        .load()
        .writeStream.foreachBatch(lambda df, batch_id: out.write(bolt.apply_df(df), batch_id))
        .option("checkpointLocation", "spark-checkpoint")
        .start()
    )

Rows are ``key`` (the broker's message id), ``value`` (the payload),
``attempt`` and ``_acker_ids``, as ``acker_spout``'s. The broker options:

* Redis Streams: ``redis`` (URL), ``stream``, ``group``; optional ``consumer``
  (default ``acker-stream``; keep it across restarts), ``field`` (``data``),
  ``dead_letter_stream`` (``<stream>:dead``), ``claim_idle`` (seconds, 60).
* RabbitMQ: ``amqp`` (URL), ``queue``; optional ``queue_type`` (``classic``),
  ``dead_letter_exchange`` (``<queue>.dead``).

``max_held`` (10,000) bounds the messages read and not yet settled at the
broker (RabbitMQ's prefetch), ``max_read`` (``max_held``) those read per
micro-batch. ``database`` (the dead letters) defaults to
``<checkpoint>/queue/dead_letters.sqlite``. Every ``acker_spout`` option
(``max_attempts``, backoff, ``failure_budget``, TLS, ...) applies. Messages
are acked at the broker once ``StreamOutput`` (given the same checkpoint)
has committed their rows: a query must write through it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from .data_source import SCHEMA, AckerSpoutStreamReader
from .stream_options import StreamOptions, _float, _int

__all__ = ["QUEUE_FORMAT", "AckerQueueDataSource", "AckerQueueStreamReader", "QueueOptions", "register_acker_queue"]

QUEUE_FORMAT = "acker_queue"
"""The format name to pass to ``spark.readStream.format``."""


@dataclass(frozen=True)
class QueueOptions:
    """The broker half of an ``acker_queue`` stream's options (the other half is its :class:`StreamOptions`)."""

    broker: str  # "redis" or "amqp"
    url: str
    name: str  # the Redis stream or the RabbitMQ queue
    group: str | None = None
    consumer: str = "acker-stream"
    field: str = "data"
    dead_letter: str | None = None  # Redis: dead-letter stream; RabbitMQ: dead-letter exchange
    claim_idle: float = 60.0
    queue_type: str = "classic"
    max_held: int = 10_000
    max_read: int = 10_000

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> tuple[QueueOptions, StreamOptions]:
        """Validate ``options``: the broker's, and the stream's with the spool as its ``path``."""
        opts = {k.lower(): v for k, v in options.items()}  # Spark's option keys are case-insensitive
        if not opts.get("checkpoint"):
            raise ValueError(
                'option "checkpoint" is required: a directory the planner and every executor can write, for the'
                " spool of messages read, the stream's logs and the ledger of settled ids"
            )
        if ("redis" in opts) == ("amqp" in opts):
            raise ValueError('give the broker: option "redis" (a URL) or option "amqp" (a URL), one of them')
        broker = "redis" if "redis" in opts else "amqp"
        name_key = "stream" if broker == "redis" else "queue"
        if not opts.get(name_key):
            raise ValueError(f'option "{name_key}" is required with option "{broker}"')
        if broker == "redis" and not opts.get("group"):
            raise ValueError('option "group" is required with option "redis": the consumer group to read as')
        max_held = _int(opts, "max_held", 10_000)
        parsed = cls(
            broker=broker,
            url=opts[broker],
            name=opts[name_key],
            group=opts.get("group"),
            consumer=opts.get("consumer", "acker-stream"),
            field=opts.get("field", "data"),
            dead_letter=opts.get("dead_letter_stream" if broker == "redis" else "dead_letter_exchange"),
            claim_idle=_float(opts, "claim_idle", 60.0),
            queue_type=opts.get("queue_type", "classic"),
            max_held=max_held,
            max_read=_int(opts, "max_read", max_held),
        )
        for key in ("max_held", "max_read"):
            if getattr(parsed, key) < 1:
                raise ValueError(f"option {key!r} must be at least 1, got {getattr(parsed, key)}")
        from ..queues.queue_planner import SPOOL_DIR

        spool = Path(opts["checkpoint"]).absolute() / SPOOL_DIR
        opts["path"] = str(spool)  # the planner fills it: the acker_spout directory of this stream
        opts.setdefault("database", str(spool.parent / "dead_letters.sqlite"))
        return parsed, StreamOptions.parse(opts)

    def open(self) -> Any:
        """The broker's :class:`~acker_spark.queues.contract.QueueSource` (a connection: in the planner only)."""
        if self.broker == "redis":
            from ..queues.redis_streams import RedisStreamSource

            assert self.group is not None
            return RedisStreamSource(
                self.url,
                self.name,
                self.group,
                consumer=self.consumer,
                field=self.field,
                dead_letter_stream=self.dead_letter,
                batch=self.max_held,
                claim_idle=self.claim_idle,
            )
        from ..queues.rabbitmq import RabbitMQSource

        # The prefetch is max_held: the broker never hands the planner more unacknowledged messages.
        return RabbitMQSource(
            self.url, self.name, batch=self.max_held, dead_letter_exchange=self.dead_letter, queue_type=self.queue_type
        )


class AckerQueueStreamReader(AckerSpoutStreamReader):
    """``acker_spout``'s reader with a :class:`~acker_spark.queues.queue_planner.QueuePlanner`; rows keyed by broker id."""

    def __init__(self, queue: QueueOptions, options: StreamOptions) -> None:
        super().__init__(options)
        self.queue = queue

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only: the broker connection stays in the planning process.
        return {**super().__getstate__(), "queue": self.queue}

    def planner(self) -> Any:
        """The planner, with the broker connection (opened here, in Spark's planning process)."""
        if self._planner is None:
            from acker_client import ClusterClient

            from ..queues.queue_planner import QueuePlanner

            opts = self.options
            cluster = ClusterClient(list(opts.ackers), security=opts.security)
            source = None
            try:
                source = self.queue.open()
                self._planner = QueuePlanner(
                    opts, cluster, source, max_held=self.queue.max_held, max_read=self.queue.max_read
                )
            except BaseException:
                if source is not None:
                    source.close()
                cluster.close()
                raise
        return self._planner

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Read the spool lines, start their trees (``acker_spout``'s read), yield them keyed by broker id."""
        from ..queues.queue_planner import spool_record

        for batch in super().read(partition):
            records = [spool_record(line) for line in batch.column(1).to_pylist()]
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([message_id for message_id, _ in records], pa.string()),
                    pa.array([payload for _, payload in records], pa.string()),
                    batch.column(2),
                    batch.column(3),
                ],
                schema=batch.schema,
            )


class AckerQueueDataSource(DataSource):
    """``spark.readStream.format("acker_queue")``: a broker's queue, each message acked after its commit."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return QUEUE_FORMAT

    def schema(self) -> str:
        """The stream's columns, as ``acker_spout``'s: ``key`` is the broker's message id."""
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        """A reader for the options given (validated here, so a bad option fails the query at start)."""
        return AckerQueueStreamReader(*QueueOptions.parse(self.options))


def register_acker_queue(spark: Any) -> None:
    """Make ``format("acker_queue")`` available in ``spark``."""
    spark.dataSource.register(AckerQueueDataSource)
