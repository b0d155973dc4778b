"""The queue source contract: what a broker must offer for SourcePipeline to drain it with per-message acks.

A broker is one class with five calls, so a third broker is a new class and
not a new driver:

* :meth:`QueueSource.read` — a bounded batch of messages, each with its
  payload, its broker id (the record's identity: replays, output and dead
  letters name it) and how many times the broker has delivered it;
* :meth:`QueueSource.ack` — the messages are done: the broker forgets them;
* :meth:`QueueSource.release` — hand them back for redelivery;
* :meth:`QueueSource.dead_letter` — move them, each with its cause, to the
  broker's dead-letter place, and ack them there;
* :meth:`QueueSource.close`.

The drain (:mod:`acker_spark.queues.drain`) calls ``ack`` and ``dead_letter``
only after the batch's output is committed, so a message leaves the broker
only once its rows are in the output, exactly once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Message", "QueueSource", "is_queue_source"]


@dataclass(frozen=True)
class Message:
    """One message as read: ``id`` (the broker's id: the record's key), ``payload``, ``deliveries`` so far (1 = first)."""

    id: str
    payload: Any
    deliveries: int = 1


class QueueSource(ABC):
    """A broker's queue drained by :class:`~acker_spark.executor_read.source_pipeline.SourcePipeline`.

    ``batch``: the most messages one batch holds unacknowledged at the broker.
    Each batch is one whole SourcePipeline run, whose fixed cost (the job's
    check, the checkpoint, the Spark jobs of its rounds, the commit) is paid
    once per batch, so the default is large: a drain of what is on the queue
    now is usually one batch. Implementations keep whatever per-delivery handle
    their broker needs (a Redis entry id is enough; a RabbitMQ delivery tag
    belongs to the channel that received it) between ``read`` and ``ack``.
    """

    batch: int = 100_000
    rereads_held: bool = False
    """True if ``read`` returns the messages it handed out before and that are not settled yet (a Redis
    consumer's pending entries) before new ones: a reader that holds some asks for them plus the new ones it wants."""

    @abstractmethod
    def read(self, limit: int) -> list[Message]:
        """Up to ``limit`` messages: first those delivered before and never acked, then new ones; [] when none."""

    @abstractmethod
    def ack(self, ids: Sequence[str]) -> int:
        """Acknowledge these messages at the broker (their output is committed); how many the broker took."""

    @abstractmethod
    def release(self, ids: Sequence[str]) -> None:
        """Hand these messages back to the broker for redelivery (a run that stopped before finishing them)."""

    @abstractmethod
    def dead_letter(self, letters: Sequence[tuple[str, str]]) -> int:
        """Move ``(id, cause)`` messages to the broker's dead-letter place with their cause, then ack them; how many."""

    @abstractmethod
    def describe(self) -> str:
        """One line for logs: the broker, the queue and the consumer."""

    def close(self) -> None:  # noqa: B027 - optional: a source holding no connection has nothing to close
        """Release the broker connection."""


def is_queue_source(source: Any) -> bool:
    """True when ``source`` is a queue (SourcePipeline.run drains it in batches instead of reading it with Spark)."""
    return isinstance(source, QueueSource)
