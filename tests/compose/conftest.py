"""The compose suite's cluster: deploy/docker-compose.yml brought up once per test run under its own project name.

Everything runs in real containers: the acker image and a Prometheus image built by
deploy/images/build.sh (`make images`). Ports are published on 127.0.0.1 only, on
free ports chosen here; the project (containers, network, volumes) is removed at
the end of the run, whether the tests passed or not. A run that was killed before
its end (an interrupted ``make test``, a timeout) cannot remove its project: the
next run removes every project of this suite whose test process is gone before it
starts its own (the project name carries that process's id). Without a Docker
engine or without the images, every test here is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
ACKER_IMAGE = os.environ.get("ACKER_IMAGE", "pyspark-acker:latest")
PROMETHEUS_IMAGE = os.environ.get("ACKER_PROMETHEUS_IMAGE", "pyspark-acker-prometheus:latest")
# Redis and RabbitMQ from Debian's packages, for the `queues` profile's services (deploy/images/brokers).
BROKERS_IMAGE = os.environ.get("ACKER_BROKERS_IMAGE", "pyspark-acker-brokers:latest")
SHARDS = 3
REPLICAS = 2
# Short enough that a lost tree is failed within seconds, long enough for a busy
# 2-core machine running three containers (the spout's backstop is about 7 s).
MESSAGE_TIMEOUT = 4.0
STARTUP_TIMEOUT = 120.0
# Project names: PREFIX, the test process's id, 6 hex digits (ComposeCluster).
PREFIX = "ackertest"
PROJECT_LABEL = "com.docker.compose.project"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder carries the `compose` marker."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.compose)


def _run(*cmd: str, check: bool = True, timeout: float = 180.0, env: dict[str, str] | None = None) -> str:
    """Run a command; return stdout; raise with its stderr when it fails and `check` is set."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _skip_reason() -> str | None:
    """Why the compose suite cannot run here, or None when it can."""
    if shutil.which("docker") is None or shutil.which("docker-compose") is None:
        return "the compose suite needs `docker` and `docker-compose` (make system-deps installs docker-compose)"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60, check=False).returncode != 0:
        return "no Docker engine answers `docker info`: the compose suite needs one"
    for image in (ACKER_IMAGE, PROMETHEUS_IMAGE):
        found = subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=60, check=False)
        if found.returncode != 0:
            return f"image {image} is missing: build it with `make images` (deploy/images/build.sh)"
    return None


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_projects(projects: set[str]) -> list[str]:
    """The compose projects of this suite whose test process no longer runs (killed or interrupted runs)."""
    stale = []
    for project in sorted(projects):
        owner = project[len(PREFIX) : -6]
        if project.startswith(PREFIX) and owner.isdigit() and not _pid_alive(int(owner)):
            stale.append(project)
    return stale


def remove_stale_projects() -> list[str]:
    """Remove the containers, networks and volumes of every stale project (see stale_projects); their names."""
    listings = {
        kind: _run("docker", kind, "ls", *(["-a"] if kind == "container" else []), "--filter", f"label={PROJECT_LABEL}",
                   "--format", f'{{{{.ID}}}} {{{{.Label "{PROJECT_LABEL}"}}}}', check=False).split("\n")
        for kind in ("container", "network", "volume")
    }  # fmt: skip
    found: dict[str, dict[str, list[str]]] = {}
    for kind, lines in listings.items():
        for line in lines:
            if line.strip() and len(line.split()) == 2:
                ident, project = line.split()
                found.setdefault(project, {}).setdefault(kind, []).append(ident)
    stale = stale_projects(set(found))
    for project in stale:
        parts = found[project]
        if parts.get("container"):
            _run("docker", "rm", "--force", "--volumes", *parts["container"], check=False)
        if parts.get("network"):
            _run("docker", "network", "rm", *parts["network"], check=False)
        if parts.get("volume"):
            _run("docker", "volume", "rm", "--force", *parts["volume"], check=False)
    return stale


class ComposeCluster:
    """The compose project: its published addresses and the operations the tests do to its containers."""

    def __init__(
        self, *, shards: int = SHARDS, replicas: int = REPLICAS, files: tuple[Path, ...] = (COMPOSE_FILE,)
    ) -> None:
        self.project = f"{PREFIX}{os.getpid()}{secrets.token_hex(3)}"  # the owner's pid: stale_projects()
        self.shards = shards
        self.files = files
        self.ports = [_free_port() for _ in range(shards)]
        self.prometheus_port = _free_port()
        self.broker_ports = {"redis": _free_port(), "rabbitmq": _free_port()}
        self.env = {
            **os.environ,
            "ACKER_IMAGE": ACKER_IMAGE,
            "PROMETHEUS_IMAGE": PROMETHEUS_IMAGE,
            "ACKER_PUBLISH_HOST": "127.0.0.1",
            "ACKER_MESSAGE_TIMEOUT": str(MESSAGE_TIMEOUT),
            # Every tree on two ackers: the node-loss case expects no record replayed because of the crash.
            "ACKER_REPLICAS": str(replicas),
            "PROMETHEUS_PORT": str(self.prometheus_port),
            "REDIS_IMAGE": BROKERS_IMAGE,
            "RABBITMQ_IMAGE": BROKERS_IMAGE,
            "REDIS_PORT": str(self.broker_ports["redis"]),
            "RABBITMQ_PORT": str(self.broker_ports["rabbitmq"]),
            **{f"ACKER_{i}_PORT": str(port) for i, port in enumerate(self.ports)},
        }
        self.network = f"{self.project}_default"

    @property
    def addresses(self) -> list[str]:
        """The ackers' published gRPC addresses, in shard order."""
        return [f"127.0.0.1:{port}" for port in self.ports]

    @property
    def prometheus_url(self) -> str:
        """The published Prometheus HTTP address."""
        return f"http://127.0.0.1:{self.prometheus_port}"

    def compose(self, *args: str, timeout: float = 180.0) -> str:
        """Run docker-compose on this project."""
        files = [arg for path in self.files for arg in ("-f", str(path))]
        cmd = ("docker-compose", "-p", self.project, *files, *args)
        return _run(*cmd, timeout=timeout, env=self.env)

    def up(self, prometheus: bool = True) -> None:
        """Start the ackers and Prometheus (Grafana has no image here) and wait until every acker is healthy."""
        services = [f"acker-{i}" for i in range(self.shards)] + (["prometheus"] if prometheus else [])
        self.compose("up", "-d", "--no-build", *services)
        for shard in range(self.shards):
            self.wait_healthy(shard)

    def up_brokers(self) -> None:
        """Start the `queues` profile's Redis and RabbitMQ and wait until both report healthy."""
        self.compose("--profile", "queues", "up", "-d", "--no-build", "redis", "rabbitmq")
        for service in ("redis", "rabbitmq"):
            self.wait_service_healthy(service)

    def broker_url(self, service: str) -> str:
        """The published URL of the `redis` or `rabbitmq` service."""
        port = self.broker_ports[service]
        return f"redis://127.0.0.1:{port}/0" if service == "redis" else f"amqp://guest:guest@127.0.0.1:{port}/%2F"

    def wait_service_healthy(self, service: str, timeout: float = STARTUP_TIMEOUT) -> None:
        """Wait until the service's healthcheck reports it healthy."""
        container = self.compose("--profile", "queues", "ps", "-q", service).strip()
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            state = json.loads(_run("docker", "inspect", "-f", "{{json .State}}", container))
            status = (state.get("Health") or {}).get("Status")
            if state.get("Running") and status == "healthy":
                return
            time.sleep(0.5)
        logs = _run("docker", "logs", "--tail", "30", container, check=False)
        raise AssertionError(f"{service} not healthy after {timeout} s (health: {status}); logs:\n{logs}")

    def restart_service(self, service: str) -> None:
        """`docker-compose restart` of a broker service, then wait for its health."""
        self.compose("--profile", "queues", "restart", "--timeout", "15", service)
        self.wait_service_healthy(service)

    def down(self) -> None:
        """Remove the project's containers, network and volumes."""
        self.compose("--profile", "queues", "down", "--volumes", "--remove-orphans", "--timeout", "5", timeout=300)

    def container(self, shard: int) -> str:
        """The container id of acker shard `shard`."""
        return self.compose("ps", "-q", f"acker-{shard}").strip()

    def state(self, shard: int) -> dict:
        """`docker inspect`'s State of the shard's container."""
        return json.loads(_run("docker", "inspect", "-f", "{{json .State}}", self.container(shard)))

    def restart_count(self, shard: int) -> int:
        """How many times Docker's restart policy restarted the shard's container."""
        return int(_run("docker", "inspect", "-f", "{{.RestartCount}}", self.container(shard)).strip())

    def wait_healthy(self, shard: int, timeout: float = STARTUP_TIMEOUT) -> None:
        """Wait until the image's HEALTHCHECK reports the shard healthy."""
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            state = self.state(shard)
            status = (state.get("Health") or {}).get("Status")
            if state.get("Running") and status == "healthy":
                return
            time.sleep(0.5)
        logs = _run("docker", "logs", "--tail", "30", self.container(shard), check=False)
        raise AssertionError(f"acker-{shard} not healthy after {timeout} s (health: {status}); logs:\n{logs}")

    def network_address(self, shard: int) -> str:
        """The shard's gRPC address on the compose network by IP: the other ackers and this host both reach it."""
        network = f'{{{{(index .NetworkSettings.Networks "{self.network}").IPAddress}}}}'
        ip = _run("docker", "inspect", "-f", network, self.container(shard)).strip()
        return f"{ip}:{7100 + shard}"

    def crash(self, shard: int) -> None:
        """SIGKILL the shard's server process from the host: a crash, which `restart: unless-stopped` answers.

        (`docker kill` would not do: the engine treats it as a deliberate stop and
        does not apply the restart policy.)
        """
        pid = int(self.state(shard)["Pid"])
        try:
            os.kill(pid, 9)
        except PermissionError:
            # Not root on the host: a throw-away container in the host's process
            # namespace sends the signal (the Docker access the suite needs anyway).
            _run("docker", "run", "--rm", "--pid=host", "--user", "0", "--entrypoint", "sh", ACKER_IMAGE,
                 "-c", f"kill -9 {pid}")  # fmt: skip

    def disconnect(self, shard: int) -> None:
        """Cut the shard's container off the compose network (its published port goes with it)."""
        _run("docker", "network", "disconnect", self.network, self.container(shard))

    def connect(self, shard: int) -> None:
        """Reconnect the shard's container to the compose network under its service name."""
        _run("docker", "network", "connect", "--alias", f"acker-{shard}", self.network, self.container(shard))

    def restart(self, shard: int) -> None:
        """`docker-compose restart` of one acker (SIGTERM, drain, start)."""
        self.compose("restart", "--timeout", "15", f"acker-{shard}")


@pytest.fixture(scope="session")
def compose_cluster() -> Iterator[ComposeCluster]:
    """The running compose project for the whole test run, removed at the end even when tests fail."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    removed = remove_stale_projects()
    if removed:
        print(f"removed the compose projects of earlier, interrupted test runs: {', '.join(removed)}")
    cluster = ComposeCluster()
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def spark() -> Any:
    """The test run's shared local SparkSession.

    Built with the same settings as tests/spark/conftest.py: local_session() returns
    the session that already exists in this process, or creates the one the Spark
    suite then reuses (and stops at the end of the run).
    """
    pytest.importorskip("pyspark")
    from acker_spark import LOCAL_MASTER, local_session

    return local_session(LOCAL_MASTER, app_name="acker-spark-tests", shuffle_partitions=4)
