"""acker-bench --mode queue: a broker's queue drained by SourcePipeline under faults, checked message by message.

``--messages N`` messages are published to a Redis stream (``--broker redis``,
AOF on) or a durable RabbitMQ queue (``--broker rabbitmq``, persistent
messages) the bench starts in a temp dir; 1% are poison (the job fails them:
dead-lettered with their cause). A driver process (:mod:`acker_bench.queue_driver`,
local Spark) drains the queue into Parquet, against real acker processes: in
one batch (one SourcePipeline run, as a nightly drain with the sources'
default batch sizes is) without faults, in one batch more than there are
faults with them. ``--faults`` (comma-separated, injected in order, the
k-th once k batches are settled): ``broker`` restarts the broker, ``driver``
kills the driver's process group with SIGKILL and starts a new one on the same
checkpoint, ``acker`` kills an acker with SIGKILL and restarts it. A driver
that exits with an error (a broker restart under its feet) is started again.

Then the broker and the output are read back: ``acked_at_broker`` (messages no
longer held nor waiting, and not dead-lettered), ``dead_lettered`` (distinct
ids in the dead-letter place), ``output_rows``, ``duplicates`` (output rows
beyond their first copy), ``missing`` (rows of acked messages not in the
output), ``unexpected`` (rows of messages that were dead-lettered or never
published), and ``ok``. ``plain_messages_per_second`` is a plain consumer of
the same broker (redis-py or pika, one Python process: read a batch, split the
words, write a Parquet file, ack the batch) over the same messages, measured in
the same run; ``drain_messages_per_second`` is the messages over the seconds
the drivers spent in ``SourcePipeline.run`` (faults included, when any), and
``files_messages_per_second`` the same job run by SourcePipeline over the same
records read from Parquet files (keyed by the message ids), in the same run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .brokers import RabbitServer, RedisServer, running_rabbitmq, running_redis
from .queue_driver import POISON, QueueDriverConfig

__all__ = ["QUEUE_FAULTS", "QueueBenchConfig", "is_poison", "payload", "run_queue_bench"]

QUEUE_FAULTS = ("broker", "driver", "acker")
QUEUE = "orders"


@dataclass(frozen=True)
class QueueBenchConfig:
    """One queue bench run."""

    broker: str = "redis"
    messages: int = 10_000
    faults: tuple[str, ...] = ()
    ackers: int = 3
    message_timeout: float = 30.0
    batches: int | None = None  # batches the drain takes (default: 1, or one more than the faults)
    timeout: float = 1800.0  # the whole drain, faults included
    keep: str | None = None  # keep the work folder here
    max_attempts: int = 4  # deliveries per message before it is dead-lettered
    compare_files: bool = True  # also run the same job over the same records from Parquet files

    def __post_init__(self) -> None:
        if self.broker not in ("redis", "rabbitmq"):
            raise ValueError(f'--broker must be "redis" or "rabbitmq", got {self.broker!r}')
        unknown = set(self.faults) - set(QUEUE_FAULTS)
        if unknown:
            raise ValueError(f"unknown --faults {sorted(unknown)}: choose among {', '.join(QUEUE_FAULTS)}")
        if self.messages < 10:
            raise ValueError(f"--messages must be at least 10, got {self.messages}")

    @property
    def batch(self) -> int:
        """Messages per batch: the whole queue in one, or one batch more than the faults (each lands after one)."""
        batches = self.batches if self.batches is not None else len(self.faults) + 1
        largest = 50_000 if self.broker == "rabbitmq" else 100_000  # the sources' defaults (RabbitMQ: prefetch)
        return min(largest, max(2, -(-self.messages // max(1, batches))))


def is_poison(i: int) -> bool:
    """1% of the messages are poison, the first one early (message 5) so that a small run has one."""
    return i % 100 == 5


def payload(i: int) -> str:
    """Message i's payload: 1-3 words, or a poison message for 1% of them."""
    words = " ".join(f"w{i}_{j}" for j in range(i % 3 + 1))
    return f"{POISON} {words}" if is_poison(i) else words


# -- brokers ---------------------------------------------------------------------------------------


class _Broker:
    """Publishing, plain consuming and reading back, for one broker kind."""

    def __init__(self, kind: str, server: RedisServer | RabbitServer) -> None:
        self.kind, self.server = kind, server

    def publish(self, queue: str, count: int) -> list[str]:
        """``count`` messages; their ids (stream entry ids, or the message_id properties)."""
        if self.kind == "redis":
            import redis

            client = redis.Redis.from_url(self.server.url)
            ids: list[str] = []
            for at in range(0, count, 1000):
                pipe = client.pipeline(transaction=False)
                for i in range(at, min(count, at + 1000)):
                    pipe.xadd(queue, {"data": payload(i)})
                ids += [i.decode() for i in pipe.execute()]
            client.close()
            return ids
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(self.server.url))
        channel = connection.channel()
        channel.confirm_delivery()
        self._declare(channel, queue)
        ids = [f"m{i:07d}" for i in range(count)]
        for i, message_id in enumerate(ids):
            properties = pika.BasicProperties(message_id=message_id, delivery_mode=2)
            channel.basic_publish("", queue, payload(i).encode(), properties)
        connection.close()
        return ids

    @staticmethod
    def _declare(channel: Any, queue: str) -> None:
        """The queue as RabbitMQSource declares it (durable, its dead-letter exchange)."""
        channel.exchange_declare(f"{queue}.dead", "fanout", durable=True)
        channel.queue_declare(f"{queue}.dead", durable=True)
        channel.queue_bind(f"{queue}.dead", f"{queue}.dead")
        channel.queue_declare(
            queue, durable=True, arguments={"x-dead-letter-exchange": f"{queue}.dead", "x-queue-type": "classic"}
        )

    def plain_consumer(self, queue: str, count: int, batch: int, folder: Path) -> float:
        """A plain consumer of ``count`` messages: read a batch, split, write Parquet, ack the batch; messages/s."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder.mkdir(parents=True, exist_ok=True)

        def work(keys: list[str], values: list[str], n: int) -> None:
            rows = [(k, w) for k, v in zip(keys, values) if not v.startswith(POISON) for w in v.split(" ")]
            table = pa.table({"id": [r[0] for r in rows], "word": [r[1] for r in rows]})
            pq.write_table(table, folder / f"part-{n:05d}.parquet")

        done, n = 0, 0
        started = time.perf_counter()
        if self.kind == "redis":
            import redis

            client: Any = redis.Redis.from_url(self.server.url)  # untyped use: replies are bytes here
            client.xgroup_create(queue, "plain", id="0", mkstream=True)
            while done < count:
                got = client.xreadgroup("plain", "c", {queue: ">"}, count=batch)
                entries = got[0][1] if got else []
                if not entries:
                    break
                work([e[0].decode() for e in entries], [e[1][b"data"].decode() for e in entries], n)
                client.xack(queue, "plain", *[e[0] for e in entries])
                done, n = done + len(entries), n + 1
            client.close()
        else:
            import pika

            connection = pika.BlockingConnection(pika.URLParameters(self.server.url))
            channel = connection.channel()
            channel.basic_qos(prefetch_count=batch)
            keys, values, last = [], [], 0
            for method, properties, body in channel.consume(queue, inactivity_timeout=1.0):
                if method is not None:
                    keys.append(properties.message_id)
                    values.append(body.decode())
                    last = method.delivery_tag
                if keys and (len(keys) >= batch or method is None):
                    work(keys, values, n)
                    channel.basic_ack(last, multiple=True)
                    done, n, keys, values = done + len(keys), n + 1, [], []
                if method is None or done >= count:
                    break
            channel.cancel()
            connection.close()
        seconds = time.perf_counter() - started
        return done / seconds if seconds > 0 else 0.0

    def state(self, queue: str, published: Sequence[str]) -> dict[str, Any]:
        """What the broker holds now: waiting or held messages, and the dead letters by id."""
        if self.kind == "redis":
            import redis

            reader: Any = redis.Redis.from_url(self.server.url, decode_responses=True)
            pending = int(reader.xpending(queue, "bench")["pending"])
            group = next(g for g in reader.xinfo_groups(queue) if g["name"] == "bench")
            waiting = int(group.get("lag") or 0)
            dead = [fields["acker_source_id"] for _, fields in reader.xrange(f"{queue}:dead")]
            reader.close()
        else:
            import pika

            connection = pika.BlockingConnection(pika.URLParameters(self.server.url))
            channel = connection.channel()
            waiting = channel.queue_declare(queue, passive=True).method.message_count
            pending = 0  # the drivers are gone: nothing is held unacknowledged
            dead = []
            while True:
                method, properties, _ = channel.basic_get(f"{queue}.dead", auto_ack=True)
                if method is None:
                    break
                dead.append(properties.message_id)
            connection.close()
        return {"held": pending, "waiting": waiting, "dead": dead}


@contextmanager
def _running(kind: str, folder: Path) -> Iterator[RedisServer | RabbitServer]:
    if kind == "redis":
        with running_redis(folder) as redis_server:
            yield redis_server
    else:
        with running_rabbitmq(folder) as rabbit_server:
            yield rabbit_server


# -- the driver ------------------------------------------------------------------------------------


class _Driver:
    """The driver subprocess: started, killed with its process group, started again; its figures read back."""

    def __init__(self, config: QueueDriverConfig, work: Path) -> None:
        self.config, self.work = config, work
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.seconds = 0.0

    def start(self) -> None:
        self.starts += 1
        self.log = self.work / f"driver-{self.starts}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "acker_bench.queue_driver", self.config.to_json()],
                cwd=self.work,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # kill -9 of the group reaches the JVM and its workers
            )

    def kill(self) -> None:
        import os
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def figures(self) -> dict[str, Any]:
        """The finished driver's JSON line."""
        for line in reversed(self.log.read_text(errors="replace").splitlines()):
            if line.startswith("{"):
                return dict(json.loads(line))
        return {}

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _settled_batches(checkpoint: Path) -> int:
    folder = checkpoint / "queue" / "settled"
    return len(list(folder.glob("batch-*.json"))) if folder.is_dir() else 0


def _output_rows(folder: Path) -> Counter[tuple[str, str]]:
    """The committed output rows, counted (only files of complete commits)."""
    import pyarrow.parquet as pq
    from acker_spark.output import published_files

    rows: Counter[tuple[str, str]] = Counter()
    for path in published_files(folder):
        table = pq.read_table(path, columns=["id", "word"])
        rows.update(zip(table.column("id").to_pylist(), table.column("word").to_pylist()))
    return rows


# -- the run ---------------------------------------------------------------------------------------


def run_queue_bench(config: QueueBenchConfig) -> dict[str, Any]:
    """Publish, take the plain consumer's rate, drain under the faults, read back; the figures (``ok``: exact)."""
    from acker_service.process_cluster import ProcessCluster

    started = time.perf_counter()
    work = Path(config.keep) if config.keep else Path(tempfile.mkdtemp(prefix="acker-bench-queue-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        with _running(config.broker, work / "broker") as server:
            broker = _Broker(config.broker, server)
            published = broker.publish(QUEUE, config.messages)
            broker.publish("plain", config.messages)
            plain_rate = broker.plain_consumer("plain", config.messages, config.batch, work / "plain")
            with ProcessCluster(count=config.ackers, message_timeout=config.message_timeout) as cluster:
                drain = _drain(config, server, cluster, work)
                files = _files_run(config, published, cluster, work) if config.compare_files else {}
            state = broker.state(QUEUE, published)
        result = _verdict(config, published, state, _output_rows(work / "out"), drain, plain_rate, started)
        if files.get("files_messages_per_second"):
            files["drain_over_files"] = round(
                result["drain_messages_per_second"] / files["files_messages_per_second"], 4
            )
        return {**result, **files}
    finally:
        if not config.keep:
            shutil.rmtree(work, ignore_errors=True)


def _drain(config: QueueBenchConfig, server: Any, cluster: Any, work: Path) -> dict[str, Any]:
    """Run drivers until one finishes the drain, injecting the faults; what happened."""
    driver_config = QueueDriverConfig(
        config.broker,
        server.url,
        QUEUE,
        config.batch,
        str(work / "checkpoint"),
        str(work / "out"),
        list(cluster.addresses),
        max_attempts=config.max_attempts,
    )
    driver = _Driver(driver_config, work)
    driver.start()
    injected: list[str] = []
    restarts_after_error = 0
    deadline = time.monotonic() + config.timeout
    try:
        while True:
            assert driver.proc is not None
            code = driver.proc.poll()
            if code is not None:
                driver.seconds += float(driver.figures().get("seconds", 0.0))
                if code == 0:
                    break
                restarts_after_error += 1
                if restarts_after_error > 10:
                    raise RuntimeError(f"the queue driver failed 10 times; last output:\n{driver.tail()}")
                driver.start()
            pending = config.faults[len(injected) :]
            if pending and _settled_batches(work / "checkpoint") >= len(injected) + 1:
                kind = pending[0]
                if kind == "broker":
                    server.restart()
                elif kind == "driver":
                    driver.kill()
                    driver.start()
                else:
                    shard = len([k for k in injected if k == "acker"]) % cluster.count
                    cluster.kill(shard)
                    time.sleep(1.0)
                    cluster.restart(shard)
                injected.append(kind)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the drain did not finish within {config.timeout:.0f} s:\n{driver.tail()}")
            time.sleep(0.2)
    finally:
        driver.kill()
    return {
        "faults_injected": injected,
        "driver_starts": driver.starts,
        "driver_restarts_after_error": restarts_after_error,
        "drain_seconds": driver.seconds,
    }


def _files_run(config: QueueBenchConfig, published: Sequence[str], cluster: Any, work: Path) -> dict[str, Any]:
    """The same job over the same records read from a Parquet copy (keyed by the message ids): its messages/s."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = work / "files" / "source"
    source.mkdir(parents=True)
    table = pa.table({"key": list(published), "value": [payload(i) for i in range(len(published))]})
    pq.write_table(table, source / "part-00000.parquet")
    driver_config = QueueDriverConfig(
        "files",
        str(source),
        QUEUE,
        config.batch,
        str(work / "files" / "checkpoint"),
        str(work / "files" / "out"),
        list(cluster.addresses),
        max_attempts=config.max_attempts,
    )
    driver = _Driver(driver_config, work / "files")
    driver.start()
    assert driver.proc is not None
    try:
        code = driver.proc.wait(timeout=config.timeout)
    finally:
        driver.kill()
    if code != 0:
        raise RuntimeError(f"the files run failed ({code}):\n{driver.tail()}")
    seconds = float(driver.figures().get("seconds", 0.0))
    return {
        "files_seconds": round(seconds, 3),
        "files_output_rows": sum(_output_rows(work / "files" / "out").values()),
        "files_messages_per_second": round(len(published) / seconds, 1) if seconds > 0 else 0.0,
    }


def _verdict(
    config: QueueBenchConfig,
    published: Sequence[str],
    state: dict[str, Any],
    rows: Counter[tuple[str, str]],
    drain: dict[str, Any],
    plain_rate: float,
    started: float,
) -> dict[str, Any]:
    """Every message acked with its rows once, or dead-lettered with its cause; the figures."""
    dead_ids = Counter(state["dead"])
    dead = set(dead_ids)
    acked = len(published) - state["held"] - state["waiting"] - len(dead & set(published))
    expected: Counter[tuple[str, str]] = Counter()
    for i, message_id in enumerate(published):
        if message_id not in dead:
            expected.update((message_id, word) for word in payload(i).split(" "))
    duplicates = sum(n - 1 for n in rows.values() if n > 1)
    missing = sum(1 for row in expected if row not in rows)
    unexpected = sum(n for row, n in rows.items() if row not in expected)
    poison = {message_id for i, message_id in enumerate(published) if is_poison(i)}
    drain_rate = len(published) / drain["drain_seconds"] if drain["drain_seconds"] > 0 else 0.0
    return {
        "mode": "queue",
        "broker": config.broker,
        "published": len(published),
        "acked_at_broker": acked,
        "dead_lettered": len(dead),
        "dead_letter_copies": sum(dead_ids.values()) - len(dead),
        "poison_dead_lettered": len(poison & dead),
        "still_at_broker": state["held"] + state["waiting"],
        "output_rows": sum(rows.values()),
        "duplicates": duplicates,
        "missing": missing,
        "unexpected": unexpected,
        **drain,
        "faults_planned": list(config.faults),
        "batch": config.batch,
        "drain_messages_per_second": round(drain_rate, 1),
        "plain_messages_per_second": round(plain_rate, 1),
        "drain_over_plain": round(drain_rate / plain_rate, 4) if plain_rate > 0 else 0.0,
        "ok": (
            duplicates == 0
            and missing == 0
            and unexpected == 0
            and acked + len(dead) == len(published)
            and state["held"] + state["waiting"] == 0
            and poison <= dead
            and drain["faults_injected"] == list(config.faults)
        ),
        "wall_seconds": round(time.perf_counter() - started, 3),
    }
