"""RabbitMQ as a queue source: manual acks on a channel the driver holds, prefetch as back-pressure.

**Where the channel lives, and why.** A delivery tag is a number the broker
gives a delivery on one channel: ``basic.ack``/``basic.nack`` must name it on
that same channel, and every delivery still unacknowledged is requeued when
the channel closes. The executors that process the records cannot hold it, so
the *driver* does: it reads a batch on its channel, keeps each message's tag
(and its body, for the dead-letter exchange) until the batch's output is
committed, then acks, nacks or dead-letters on the same channel. Prefetch
(``basic.qos``) is set to the batch size, so the broker never hands the driver
more unacknowledged messages than one batch holds. A batch is one whole
SourcePipeline run, so it is large (50,000 messages by default, at most
65,535: AMQP's prefetch count is a 16-bit number); the driver holds each
delivery's tag, properties and body in memory until the batch is committed,
and the broker keeps them unacknowledged on the channel meanwhile (its
``consumer_timeout``, 30 minutes by default, must outlast a batch's run: past
it the broker closes the channel and requeues the batch, which the ledger of
settled ids then acks without processing it twice).

When the driver dies, the channel closes and the broker requeues the batch
(``redelivered``; quorum queues count ``x-delivery-count``). The restarted
driver finishes the batch from its checkpoint copy; those messages then come
again with void tags' successors, and the drain's ledger of settled ids
(:mod:`acker_spark.queues.settled`) acks them without processing them twice.

A message's identity is its ``message_id`` property (publishers must set it:
a message without one is dead-lettered at read). Dead letters are published
to the queue's dead-letter exchange with the cause in the ``x-acker-cause``
header (publisher confirms on), then acked; ``release`` is ``basic.nack``
with ``requeue``: the broker counts the delivery.

**A broker restart or a lost connection** voids every held tag (the broker
requeues those messages). The source reconnects by itself, retrying for up to
``reconnect_for`` seconds: a read that loses its connection drops what it read
(requeued) and reads again on the new channel; an ack, release or dead-letter
call reports what it settled before the loss, and the rest come back as
redeliveries, which the drain's ledger settles without processing them again.
A dead letter published just before a loss may be published once more when its
message comes back (dead letters are at least once).

**Settling in delivery order.** The broker keeps a channel's unacknowledged
deliveries in delivery order, and a ``basic.ack``/``basic.nack`` of one tag
walks them from the oldest until it finds the tag: a tag settled out of
order costs as many steps as deliveries older than it are still held, so
settling a whole batch in the order its records happen to end is quadratic
in the batch (a plain pika consumer holding 50,000 messages acked 14,542 a
second in order, 599 shuffled). Each call therefore settles its messages in
ascending tag order, and settles in one frame (``multiple``) the run of its
tags below the lowest tag still held for a later verdict: ``multiple``
settles *every* outstanding delivery up to its tag on the channel, and below
that tag every delivery of this channel is either in the run or was settled
before (a read hands back what it does not return before it ends), so the
frame settles exactly the run.

The connection is opened with heartbeats off by default (``heartbeat=0``):
a blocking pika connection answers heartbeats only while the driver talks to
it, and a batch's Spark run can be longer than any heartbeat timeout.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from .contract import Message, QueueSource

__all__ = ["CAUSE_HEADER", "RabbitMQSource"]

log = logging.getLogger(__name__)

CAUSE_HEADER = "x-acker-cause"
"""The header a dead-lettered message carries its cause in."""

_T = TypeVar("_T")

MAX_PREFETCH = 65_535
"""The largest ``basic.qos`` prefetch count (a 16-bit field), so the largest batch."""


class RabbitMQSource(QueueSource):
    """Messages of ``queue`` (classic or quorum, durable) read with manual acks; the payload is the body.

    ``url``: an AMQP URL (``amqp://user:password@host:5672/%2F``). With
    ``declare`` (default) the queue is declared durable with
    ``x-dead-letter-exchange`` set to ``dead_letter_exchange`` (default
    ``<queue>.dead``, a fanout exchange with a queue of the same name bound to
    it); else both must exist so configured. ``wait``: seconds a read waits
    for more messages before returning a smaller batch. ``batch``: most
    messages held unacknowledged per batch, 1 to 65,535 (the channel's
    prefetch must allow the whole batch). ``reconnect_for``: seconds the source
    keeps trying to reconnect after losing the broker before it raises.
    """

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        batch: int = 50_000,
        dead_letter_exchange: str | None = None,
        queue_type: str = "classic",
        declare: bool = True,
        decode: bool = True,
        wait: float = 0.5,
        heartbeat: int = 0,
        reconnect_for: float = 120.0,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1 message, got {batch}")
        if batch > MAX_PREFETCH:
            raise ValueError(
                f"batch={batch:,}: a RabbitMQ batch is at most {MAX_PREFETCH:,} messages (the channel's prefetch "
                "count, a 16-bit number, must allow the whole batch); a larger drain runs as several batches"
            )
        if queue_type not in ("classic", "quorum"):
            raise ValueError(f'queue_type must be "classic" or "quorum", got {queue_type!r}')
        import pika

        self._pika = pika
        self.parameters = pika.URLParameters(url)
        self.parameters.heartbeat = heartbeat
        self.queue, self.batch, self.decode, self.wait = queue, batch, decode, wait
        self.queue_type = queue_type
        self.dead_letter_exchange = dead_letter_exchange or f"{queue}.dead"
        self.declare = declare
        self.reconnect_for = reconnect_for
        self.reconnects = 0
        # What a lost connection or a broker restart raises (pika's connection and channel errors).
        self._lost = (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError)
        self._held: dict[str, tuple[int, Any, bytes]] = {}  # message id -> (delivery tag, properties, body)
        self._open()

    def describe(self) -> str:
        """One line for logs."""
        return f"RabbitMQ queue {self.queue!r} at {self.parameters.host}:{self.parameters.port}"

    def _open(self) -> None:
        self.connection = self._pika.BlockingConnection(self.parameters)
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()  # a dead letter is acked only once the broker has it
        self.channel.basic_qos(prefetch_count=self.batch)  # back-pressure: one batch unacknowledged at most
        if self.declare:
            self.channel.exchange_declare(self.dead_letter_exchange, "fanout", durable=True)
            self.channel.queue_declare(self.dead_letter_exchange, durable=True)
            self.channel.queue_bind(self.dead_letter_exchange, self.dead_letter_exchange)
            self.channel.queue_declare(
                self.queue,
                durable=True,
                arguments={"x-dead-letter-exchange": self.dead_letter_exchange, "x-queue-type": self.queue_type},
            )
        self._held.clear()  # tags of a closed channel are void

    def _channel_ok(self) -> bool:
        """True if the channel the held tags belong to is still open; else reopen (the broker requeued them)."""
        if self.channel.is_open and self.connection.is_open:
            return True
        log.warning("%s: the channel closed; its unacknowledged messages were requeued by the broker", self.describe())
        self._reopen()
        return False

    def _reopen(self) -> None:
        """Open a new connection and channel, retrying while the broker is away (up to ``reconnect_for`` s)."""
        self._held.clear()  # the old channel's tags are void whether or not a new one opens
        give_up = time.monotonic() + self.reconnect_for
        pause = 0.2
        while True:
            try:
                self._open()
            except self._lost as err:
                if time.monotonic() + pause > give_up:
                    raise ConnectionError(
                        f"{self.describe()}: no connection for {self.reconnect_for:.0f} s ({err!r}); the messages it"
                        " held are back on the queue: run again on the same checkpoint once the broker is up"
                    ) from err
                time.sleep(pause)
                pause = min(pause * 2, 2.0)
            else:
                self.reconnects += 1
                log.warning("%s: reconnected; the messages held on the lost channel were requeued", self.describe())
                return

    def _settle(self, settle: Callable[[], _T], settled: Callable[[], _T]) -> _T:
        """Run ``settle``; if the broker goes away meanwhile, reconnect and return ``settled()`` (what was done)."""
        try:
            return settle()
        except self._lost as err:
            log.warning("%s: the connection was lost while settling (%r)", self.describe(), err)
            self._reopen()
            return settled()

    # -- reading ----------------------------------------------------------------------------

    def read(self, limit: int) -> list[Message]:
        """Up to ``limit`` messages (requeued ones first, as the broker orders them); fewer after ``wait`` idle.

        A connection lost during the read drops what was read (the broker
        requeues it), reconnects and reads again.
        """
        while True:
            self._channel_ok()
            try:
                return self._read(limit)
            except self._lost as err:
                log.warning("%s: the connection was lost during a read (%r); reading again", self.describe(), err)
                self._reopen()

    def _read(self, limit: int) -> list[Message]:
        messages: list[Message] = []
        unusable: list[tuple[str, str]] = []
        for method, properties, body in self.channel.consume(self.queue, inactivity_timeout=self.wait):
            if method is None:
                break
            message_id = properties.message_id
            if not message_id:
                message_id = f"no-id:{method.delivery_tag}"
                unusable.append((message_id, "ValueError: the message has no message_id property (its identity)"))
            elif message_id in self._held:
                # The publisher reused an id: the first is in this batch; the other waits for the next one.
                self.channel.basic_nack(method.delivery_tag, requeue=True)
                break
            else:
                payload = body.decode("utf-8", errors="replace") if self.decode else body
                messages.append(Message(message_id, payload, _deliveries(method, properties)))
            self._held[message_id] = (method.delivery_tag, properties, body)
            if len(messages) + len(unusable) >= limit:
                break
        self.channel.cancel()  # messages delivered past the batch go back to the queue
        if unusable:
            log.warning("%s: %d messages without message_id dead-lettered", self.describe(), len(unusable))
            self.dead_letter(unusable)
        return messages

    # -- settling ---------------------------------------------------------------------------

    def ack(self, ids: Sequence[str]) -> int:
        """``basic.ack`` the held messages in delivery order; how many (tags of a closed channel are void: 0)."""
        if not self._channel_ok():
            return 0
        done = [0]

        def ack(tag: int, multiple: bool) -> None:
            self.channel.basic_ack(tag, multiple=multiple)

        # Acks sent before a loss count (the last frame, one message or a multiple run, may not have reached the
        # broker: its messages come back, and the drain's ledger acks them again without processing them).
        return self._settle(lambda: self._settle_in_order(ids, ack, done), lambda: done[0])

    def release(self, ids: Sequence[str]) -> None:
        """``basic.nack`` with requeue: the broker redelivers them (and counts the delivery on quorum queues)."""
        if not self._channel_ok():
            return

        def nack(tag: int, multiple: bool) -> None:
            self.channel.basic_nack(tag, multiple=multiple, requeue=True)

        self._settle(lambda: self._settle_in_order(ids, nack, [0]), lambda: 0)  # a lost channel requeued the rest

    def _settle_in_order(self, ids: Iterable[str], send: Callable[[int, bool], None], done: list[int]) -> int:
        """Settle the held messages of ``ids`` with ``send(tag, multiple)``, ascending, in as few frames as is safe.

        A message stops being held once its frame is sent: one whose frame was not sent (an error on the way) is
        still outstanding on the channel, and must stay below any later ``multiple`` frame's reach.
        """
        chosen = self._held_in_order(ids)
        frames = _frames([tag for tag, _ in chosen], self._lowest_tag_held_besides(chosen))
        at = 0
        for tag, multiple, count in frames:
            send(tag, multiple)
            for _, message_id in chosen[at : at + count]:
                del self._held[message_id]
            at += count
            done[0] += count
        return done[0]

    def _held_in_order(self, ids: Iterable[str]) -> list[tuple[int, str]]:
        """``(delivery tag, id)`` of each held message among ``ids``, once, ascending by tag (the broker's order)."""
        tags = {message_id: self._held[message_id][0] for message_id in ids if message_id in self._held}
        return sorted((tag, message_id) for message_id, tag in tags.items())

    def _lowest_tag_held_besides(self, chosen: list[tuple[int, str]]) -> int | None:
        """The lowest tag held and not among ``chosen``: a ``multiple`` frame for ``chosen`` must stop below it."""
        ids = {message_id for _, message_id in chosen}
        return min((held[0] for message_id, held in self._held.items() if message_id not in ids), default=None)

    def dead_letter(self, letters: Sequence[tuple[str, str]]) -> int:
        """Publish each held message to the dead-letter exchange with its cause in a header, then ack it."""
        if not self._channel_ok():
            return 0
        moved = [0]
        return self._settle(lambda: self._dead_letter_each(letters, moved), lambda: moved[0])

    def _dead_letter_each(self, letters: Sequence[tuple[str, str]], moved: list[int]) -> int:
        causes: dict[str, str] = {}
        for message_id, cause in letters:
            causes.setdefault(message_id, cause)  # a message named twice keeps its first cause
        # In delivery order, each acked right after the broker confirmed its copy: a loss between the two
        # publishes at most that one again when its message comes back (dead letters are at least once).
        for tag, message_id in self._held_in_order(causes):
            _, properties, body = self._held[message_id]
            headers = dict(properties.headers or {})
            headers[CAUSE_HEADER] = causes[message_id]
            headers["x-acker-queue"] = self.queue
            out = self._pika.BasicProperties(
                message_id=properties.message_id,
                content_type=properties.content_type,
                delivery_mode=2,  # persistent
                headers=headers,
            )
            self.channel.basic_publish(self.dead_letter_exchange, self.queue, body, out, mandatory=True)
            self.channel.basic_ack(tag)
            del self._held[message_id]
            moved[0] += 1
        return moved[0]

    def close(self) -> None:
        """Close the connection (anything still held is requeued by the broker)."""
        if self.connection.is_open:
            try:
                self.connection.close()
            except self._lost:
                pass  # the broker went away first: nothing is left to close


def _frames(tags: Sequence[int], lowest_held_besides: int | None) -> list[tuple[int, bool, int]]:
    """The frames that settle ``tags`` (ascending): ``(tag, multiple, how many of tags it settles)``, in order.

    The tags below ``lowest_held_besides`` (the lowest tag held for another verdict; None: no other) are
    every outstanding delivery up to the last of them, so one ``multiple`` frame settles them; each tag above
    it gets a frame of its own, still ascending, so that the broker's search for it passes only deliveries held
    for other verdicts, never ones this call has yet to settle.
    """
    cut = len(tags) if lowest_held_besides is None else bisect_left(tags, lowest_held_besides)
    if cut < 2:
        return [(tag, False, 1) for tag in tags]
    return [(tags[cut - 1], True, cut)] + [(tag, False, 1) for tag in tags[cut:]]


def _deliveries(method: Any, properties: Any) -> int:
    """This delivery's number: quorum queues count (``x-delivery-count``); classic ones say only ``redelivered``."""
    count = (properties.headers or {}).get("x-delivery-count")
    if count is not None:
        return int(count) + 1
    return 2 if method.redelivered else 1
