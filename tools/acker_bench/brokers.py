"""Real brokers for the queue tests and ``acker-bench --mode queue``: redis-server and rabbitmq-server in a temp dir.

Debian's ``redis-server`` and ``rabbitmq-server`` packages (``make system-deps``
installs them); the tests and the bench start their own processes on free
ports, never the system services, and stop them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError(f"{name} is not installed: run `make system-deps` (Debian package {name})")
    return found


def _wait_port(port: int, process: subprocess.Popen[bytes], seconds: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {seconds} s: {log.read_text()[-2000:]}")


def _wait_loaded(url: str, seconds: float) -> None:
    """Until redis answers PING (it refuses commands while it loads its AOF after a restart)."""
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + seconds
    try:
        while True:
            try:
                client.ping()
                return
            except redis.exceptions.BusyLoadingError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        client.close()


@dataclass
class RedisServer:
    """A running redis-server: its URL; ``restart()`` stops it (SIGTERM: an AOF flush) and starts it again."""

    port: int
    folder: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = self.folder / "redis.log"
        self.process = subprocess.Popen(
            [
                _binary("redis-server"),
                "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--logfile", str(log), "--daemonize", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        _wait_port(self.port, self.process, 20.0, "redis-server", log)
        _wait_loaded(self.url, 20.0)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def running_redis(folder: Path) -> Iterator[RedisServer]:
    """A redis-server with AOF (fsync always) in ``folder`` on a free port, stopped on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    server = RedisServer(free_port(), folder, None)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _rabbitmq_script() -> str:
    """The server script itself: Debian's /usr/sbin wrapper would switch to the rabbitmq user, who cannot
    write this test's temp dir."""
    wrapper = _binary("rabbitmq-server")
    scripts = sorted(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*/sbin/rabbitmq-server"))
    return str(scripts[-1]) if scripts else wrapper


@dataclass
class RabbitServer:
    """A running rabbitmq-server node of its own: its AMQP URL; ``restart()`` stops and starts the node."""

    port: int
    folder: Path
    node: str
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_DIST_PORT=str(self.port + 20000) if self.port < 45000 else str(free_port()),
            RABBITMQ_MNESIA_BASE=str(self.folder / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.folder / "log"),
            RABBITMQ_CONFIG_FILE=str(self.folder / "rabbitmq"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.folder / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.folder / "rabbit.pid"),
            HOME=str(self.folder),
        )
        return env

    def start(self) -> None:
        log = self.folder / "stdout.log"
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [_rabbitmq_script()],
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_port(self.port, self.process, 60.0, "rabbitmq-server", log)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def running_rabbitmq(folder: Path) -> Iterator[RabbitServer]:
    """A rabbitmq-server node (own node name, port, mnesia and log folders under ``folder``), stopped on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "enabled_plugins").write_text("[].\n")
    (folder / "rabbitmq.conf").write_text("loopback_users = none\n")
    server = RabbitServer(free_port(), folder, f"acker{os.getpid()}@localhost", None)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()
