"""The RabbitMQ queue source against a real rabbitmq-server node: manual acks, prefetch, nack, dead-letter exchange."""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

import pika
import pytest
from acker_spark.queues import Message, RabbitMQSource
from acker_spark.queues.rabbitmq import CAUSE_HEADER

from .brokers import RabbitServer

_names = itertools.count()


@pytest.fixture
def queue(rabbitmq_server: RabbitServer) -> str:
    """A queue name of this test's own (the node is shared by the session)."""
    return f"orders{next(_names)}"


def publish(server: RabbitServer, queue: str, count: int, *, ids: bool = True) -> None:
    """``count`` persistent messages ``m<i>`` with message_id ``id<i>``, each confirmed by the broker.

    Confirms matter: a persistent message published without them may still be on its way to the disk when
    the broker is stopped, and it is then gone after the restart (a clean-clone CI run lost two that way).
    """
    connection = pika.BlockingConnection(pika.URLParameters(server.url))
    channel = connection.channel()
    channel.confirm_delivery()
    for i in range(count):
        properties = pika.BasicProperties(message_id=f"id{i}" if ids else None, delivery_mode=2)
        channel.basic_publish("", queue, f"m{i}".encode(), properties)
    connection.close()


def drain_plain(server: RabbitServer, queue: str) -> list[tuple[Any, bytes]]:
    """Every message on ``queue`` now (properties, body), acked."""
    connection = pika.BlockingConnection(pika.URLParameters(server.url))
    channel = connection.channel()
    out = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        out.append((properties, body))
    connection.close()
    return out


def test_read_holds_a_batch_and_acks_it(rabbitmq_server: RabbitServer, queue: str) -> None:
    """A read returns at most a batch (prefetch), held until acked; acked messages are gone from the broker."""
    src = RabbitMQSource(rabbitmq_server.url, queue, batch=3, wait=0.2)
    publish(rabbitmq_server, queue, 5)
    first = src.read(3)
    assert first == [Message(f"id{i}", f"m{i}", 1) for i in range(3)]
    assert src.ack([m.id for m in first]) == 3
    assert src.ack([m.id for m in first]) == 0
    rest = src.read(3)
    assert [m.id for m in rest] == ["id3", "id4"]
    src.ack([m.id for m in rest])
    assert src.read(3) == [] and drain_plain(rabbitmq_server, queue) == []
    src.close()


def test_release_requeues_with_the_delivery_counted(rabbitmq_server: RabbitServer, queue: str) -> None:
    """basic.nack(requeue): the same messages come again, marked redelivered (a second delivery)."""
    src = RabbitMQSource(rabbitmq_server.url, queue, batch=10, wait=0.2)
    publish(rabbitmq_server, queue, 2)
    src.release([m.id for m in src.read(10)])
    again = src.read(10)
    assert sorted((m.id, m.deliveries) for m in again) == [("id0", 2), ("id1", 2)]
    src.close()


def test_a_closed_channel_requeues_what_it_held(rabbitmq_server: RabbitServer, queue: str) -> None:
    """A driver that dies holding a batch: the broker requeues it; a new source gets it again, redelivered."""
    dying = RabbitMQSource(rabbitmq_server.url, queue, batch=10, wait=0.2)
    publish(rabbitmq_server, queue, 3)
    assert len(dying.read(10)) == 3
    dying.connection.close()  # the channel, and with it every tag, gone
    assert dying.ack(["id0"]) == 0  # void tags: nothing acked, the source reopened
    again = RabbitMQSource(rabbitmq_server.url, queue, batch=10, wait=0.2)
    assert sorted((m.id, m.deliveries) for m in again.read(10)) == [("id0", 2), ("id1", 2), ("id2", 2)]
    again.close()
    dying.close()


def read_until(src: RabbitMQSource, count: int, seconds: float = 30.0) -> list[Message]:
    """Reads until ``count`` messages came or ``seconds`` passed: a read returns fewer than asked once the queue
    stays idle for its ``wait``, as it may while a node just restarted is still recovering its queues."""
    got: list[Message] = []
    deadline = time.monotonic() + seconds
    while len(got) < count and time.monotonic() < deadline:
        got += src.read(10)
    return got


def test_a_broker_restart_voids_the_held_tags_and_the_source_reconnects_by_itself(
    rabbitmq_server: RabbitServer, queue: str
) -> None:
    """rabbitmq-server restarts while a batch is held: acks find void tags, the next read gets the batch again."""
    src = RabbitMQSource(rabbitmq_server.url, queue, batch=10, wait=0.2)
    publish(rabbitmq_server, queue, 4)
    try:
        assert len(src.read(2)) == 2
        rabbitmq_server.restart()
        assert src.ack(["id0", "id1"]) == 0  # the channel is gone: nothing acked, and no error
        again = read_until(src, 4)
        assert sorted(m.id for m in again) == ["id0", "id1", "id2", "id3"]  # durable queue, persistent messages
        assert {m.id: m.deliveries for m in again}["id0"] == 2  # the broker counted the first delivery
        assert src.ack([m.id for m in again]) == 4 and src.reconnects == 1
        assert src.read(10) == []
    finally:
        src.close()


def test_a_read_waits_for_a_broker_that_is_away_then_reads(rabbitmq_server: RabbitServer, queue: str) -> None:
    """The broker is stopped when a read starts and back a second later: the read reconnects and returns."""
    import threading

    src = RabbitMQSource(rabbitmq_server.url, queue, batch=10, wait=0.2)
    publish(rabbitmq_server, queue, 3)
    rabbitmq_server.stop()
    back = threading.Timer(1.0, rabbitmq_server.start)
    back.start()
    try:
        got = read_until(src, 3)  # waits for the broker first
        assert sorted(m.id for m in got) == ["id0", "id1", "id2"]
        assert src.ack(["id0", "id1", "id2"]) == 3
    finally:
        back.join()
        src.close()


def test_a_broker_away_longer_than_reconnect_for_is_an_error_that_says_so(
    rabbitmq_server: RabbitServer, queue: str
) -> None:
    src = RabbitMQSource(rabbitmq_server.url, queue, batch=10, wait=0.2, reconnect_for=1.0)
    rabbitmq_server.stop()
    try:
        with pytest.raises(ConnectionError, match=r"no connection for 1 s.*run again on the same checkpoint"):
            src.read(10)
    finally:
        rabbitmq_server.start()
    src.close()


def test_dead_letter_goes_to_the_queues_exchange_with_its_cause(rabbitmq_server: RabbitServer, queue: str) -> None:
    """The message, its id and its cause (a header) in the dead-letter queue; the original acked."""
    src = RabbitMQSource(rabbitmq_server.url, queue, batch=10, wait=0.2)
    publish(rabbitmq_server, queue, 2)
    src.read(10)
    assert src.dead_letter([("id1", "FAILED after 3 attempts: ValueError: bad")]) == 1
    src.ack(["id0"])
    ((properties, body),) = drain_plain(rabbitmq_server, f"{queue}.dead")
    assert (properties.message_id, body) == ("id1", b"m1")
    assert properties.headers[CAUSE_HEADER] == "FAILED after 3 attempts: ValueError: bad"
    assert src.read(10) == []
    src.close()


def test_message_without_id_is_dead_lettered_at_read(rabbitmq_server: RabbitServer, queue: str) -> None:
    """No message_id, no identity: dead-lettered with the reason, never processed."""
    src = RabbitMQSource(rabbitmq_server.url, queue, batch=10, wait=0.2)
    publish(rabbitmq_server, queue, 1, ids=False)
    assert src.read(10) == []
    ((properties, _),) = drain_plain(rabbitmq_server, f"{queue}.dead")
    assert "no message_id" in properties.headers[CAUSE_HEADER]
    src.close()


def test_bad_options_are_refused(rabbitmq_server: RabbitServer, queue: str) -> None:
    """A batch of nothing, one the channel's prefetch cannot allow, or an unknown queue type: said so before connecting."""
    with pytest.raises(ValueError, match="batch must be at least 1"):
        RabbitMQSource(rabbitmq_server.url, queue, batch=0)
    with pytest.raises(ValueError, match="at most 65,535 messages"):
        RabbitMQSource(rabbitmq_server.url, queue, batch=65_536)
    with pytest.raises(ValueError, match="queue_type"):
        RabbitMQSource(rabbitmq_server.url, queue, queue_type="stream")


class RecordingChannel:
    """The source's real channel, with the settling frames it sends recorded as ``(method, tag, multiple)``."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self.frames: list[tuple[str, int, bool]] = []

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.frames.append(("ack", delivery_tag, multiple))
        self._channel.basic_ack(delivery_tag, multiple=multiple)

    def basic_nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self.frames.append(("nack" if requeue else "nack-drop", delivery_tag, multiple))
        self._channel.basic_nack(delivery_tag, multiple=multiple, requeue=requeue)

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        self.frames.append(("reject" if requeue else "reject-drop", delivery_tag, False))
        self._channel.basic_reject(delivery_tag, requeue=requeue)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def take(self) -> list[tuple[str, int, bool]]:
        """The frames sent since the last take."""
        frames, self.frames = self.frames, []
        return frames


def recording(src: RabbitMQSource) -> RecordingChannel:
    """Put a recorder around ``src``'s channel (after its reads: the tags stay those of the same channel)."""
    recorder = RecordingChannel(src.channel)
    src.channel = recorder
    return recorder


def test_settling_goes_in_delivery_order_with_one_frame_for_a_safe_prefix(
    rabbitmq_server: RabbitServer, queue: str
) -> None:
    """Each call settles ascending by tag; ``multiple`` only over a run that no other held tag lies under.

    id<i> is delivery tag i+1. A shuffled settle order must reach the broker ascending (an ack out of order
    costs the broker a walk over every older held delivery), and a multiple frame must never sweep a message
    held for another verdict: the broker state at the end says nothing was swept.
    """
    src = RabbitMQSource(rabbitmq_server.url, queue, batch=20, wait=0.2)
    try:
        publish(rabbitmq_server, queue, 12)
        assert [m.id for m in src.read(20)] == [f"id{i}" for i in range(12)]
        channel = recording(src)

        assert src.dead_letter([("id7", "late"), ("id2", "early")]) == 2
        assert channel.take() == [("ack", 3, False), ("ack", 8, False)]  # tag 1 is still held: no multiple
        src.release(["id10", "id4", "id9"])
        assert channel.take() == [("nack", 5, False), ("nack", 10, False), ("nack", 11, False)]
        # Held now: tags 1, 2, 4, 6, 7, 9, 12. Acking 6, 1, 4, 2, 12: tags 1-6 are all acked or settled
        # before, and 7 (id6) is held for later, so one frame settles up to 6 and 12 goes alone.
        assert src.ack(["id5", "id0", "id3", "id1", "id11"]) == 5
        assert channel.take() == [("ack", 6, True), ("ack", 12, False)]
        src.release(["id8", "id6", "id8"])  # the last two held: one frame, each message once
        assert channel.take() == [("nack", 9, True)]
        assert src.ack(["id8"]) == 0 and channel.take() == []  # settled already: nothing sent
    finally:
        src.close()
    back = sorted(p.message_id for p, _ in drain_plain(rabbitmq_server, queue))
    assert back == ["id10", "id4", "id6", "id8", "id9"]
    dead = drain_plain(rabbitmq_server, f"{queue}.dead")
    assert sorted((p.message_id, p.headers[CAUSE_HEADER]) for p, _ in dead) == [("id2", "early"), ("id7", "late")]


def test_a_whole_batch_settled_at_once_is_one_frame(rabbitmq_server: RabbitServer, queue: str) -> None:
    """Nothing else held: a shuffled ack of every held message is a single multiple ack up to the highest tag."""
    src = RabbitMQSource(rabbitmq_server.url, queue, batch=50, wait=0.2)
    try:
        publish(rabbitmq_server, queue, 50)
        ids = [m.id for m in src.read(50)]
        random.Random(7).shuffle(ids)
        channel = recording(src)
        assert src.ack(ids) == 50
        assert channel.take() == [("ack", 50, True)]
        assert src.read(50) == [] and drain_plain(rabbitmq_server, queue) == []
    finally:
        src.close()


def test_a_shuffled_settle_ends_each_message_in_exactly_one_place(rabbitmq_server: RabbitServer, queue: str) -> None:
    """2,000 messages, each given a verdict at random and settled in shuffled calls of mixed sizes: the acked
    are gone, the released are back on the queue, the dead-lettered are in the dead-letter queue; every call's
    frames ascend, and the counts the calls return add up. Late in the run the lowest held tags get settled,
    so some acks and releases go as multiple frames over runs with gaps (tags the reads handed back)."""
    count = 2000
    rng = random.Random(11)
    src = RabbitMQSource(rabbitmq_server.url, queue, batch=count, wait=0.5)
    acked = dead = 0
    multiple: list[tuple[str, int, bool]] = []
    try:
        publish(rabbitmq_server, queue, count)
        ids: list[str] = []
        while len(ids) < count:  # reads of 300: each hands back what came past it, so the held tags have gaps
            got = src.read(min(300, count - len(ids)))
            assert got, f"the queue ran dry after {len(ids)} messages"
            ids += [m.id for m in got]
        assert sorted(ids) == sorted(f"id{i}" for i in range(count))
        verdict = {message_id: rng.choice(("ack", "ack", "ack", "release", "dead")) for message_id in ids}
        rng.shuffle(ids)
        channel = recording(src)
        at = 0
        while at < len(ids):
            size = rng.choice((1, 7, 50, 300))
            chunk, at = ids[at : at + size], at + size
            acked += src.ack([i for i in chunk if verdict[i] == "ack"])
            multiple += assert_ascending(channel.take())
            src.release([i for i in chunk if verdict[i] == "release"])
            multiple += assert_ascending(channel.take())
            dead += src.dead_letter([(i, "bad") for i in chunk if verdict[i] == "dead"])
            assert assert_ascending(channel.take()) == []  # dead letters: each acked after its copy
    finally:
        src.close()
    expected = {kind: sorted(i for i, v in verdict.items() if v == kind) for kind in ("ack", "release", "dead")}
    assert (acked, dead) == (len(expected["ack"]), len(expected["dead"]))
    assert "ack" in {kind for kind, _, _ in multiple}  # the multiple frames were exercised
    assert sorted(p.message_id for p, _ in drain_plain(rabbitmq_server, queue)) == expected["release"]
    assert sorted(p.message_id for p, _ in drain_plain(rabbitmq_server, f"{queue}.dead")) == expected["dead"]


def assert_ascending(frames: list[tuple[str, int, bool]]) -> list[tuple[str, int, bool]]:
    """One settling call's frames name their tags in ascending order (the broker's cheap order); its multiple ones."""
    tags = [tag for _, tag, _ in frames]
    assert tags == sorted(tags), f"frames out of delivery order: {frames}"
    return [frame for frame in frames if frame[2]]
