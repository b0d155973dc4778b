"""Fixtures for the deployment tests: repository paths, a YAML reader, a metrics-enabled acker cluster."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from acker_protocol import grpc_options
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from acker_service.process_cluster import ProcessCluster

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SPOUT = "deploy-test"


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def deploy_dir() -> Path:
    """The deploy/ folder."""
    return DEPLOY


def require_tool(name: str) -> str:
    """The path of a Debian-packaged tool the test needs, or a skip saying how to get it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"`{name}` is not installed (make test installs it: apt-get install {_package(name)})")
    return path


def _package(tool: str) -> str:
    """The Debian package that provides `tool`."""
    return {"promtool": "prometheus", "prometheus": "prometheus"}.get(tool, tool)


@pytest.fixture(scope="session")
def docker_compose() -> str:
    """Path of the docker-compose binary (Debian's docker-compose package)."""
    return require_tool("docker-compose")


@pytest.fixture(scope="session")
def load_yaml() -> Callable[[str], Any]:
    """A function parsing YAML text (compose, Prometheus and Grafana files) into Python objects."""
    return yaml.safe_load


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def owned_roots(shard: int, count: int, n: int, start: int = 1_000_003) -> list[int]:
    """`n` distinct non-zero root ids owned by `shard` of `count` (root % count == shard)."""
    first = start + (shard - start) % count
    return [first + k * count for k in range(n)]


def apply_workload(address: str, shard: int, count: int) -> acker_pb2.ApplyResponse:
    """Send one Apply batch to a shard: trees that get acked, trees that fail, one left pending."""
    acked, failed, pending = (
        owned_roots(shard, count, 5),
        owned_roots(shard, count, 2, 5_000_011),
        owned_roots(shard, count, 1, 9_000_017),
    )
    init, ack, fail = acker_pb2.OP_KIND_INIT, acker_pb2.OP_KIND_ACK, acker_pb2.OP_KIND_FAIL
    kinds, roots, values = [], [], []
    for root in acked:
        # INIT with the spout tuple's edge id, then the ack of that edge: xor back to 0.
        kinds += [init, ack]
        roots += [root, root]
        values += [root ^ 0xABCDEF, root ^ 0xABCDEF]
    for root in failed:
        kinds += [init, fail]
        roots += [root, root]
        values += [77, 0]
    kinds.append(init)
    roots += pending
    values.append(12345)
    request = acker_pb2.ApplyRequest(kinds=kinds, root_ids=roots, values=values, spouts=[SPOUT])
    with grpc.insecure_channel(address, options=grpc_options.client_options()) as channel:
        return acker_pb2_grpc.AckerStub(channel).Apply(request, timeout=10)


def describe(address: str) -> acker_pb2.DescribeResponse:
    """The Describe answer of the acker at `address`."""
    with grpc.insecure_channel(address, options=grpc_options.client_options()) as channel:
        return acker_pb2_grpc.AckerStub(channel).Describe(acker_pb2.DescribeRequest(), timeout=10)


@pytest.fixture(scope="session")
def metrics_cluster() -> Iterator[ProcessCluster]:
    """Three acker processes with metrics on free ports, shared by the read-only tests."""
    with ProcessCluster(count=3, metrics_base_port=0, message_timeout=2.0) as cluster:
        yield cluster


# Test modules cannot import from conftest under --import-mode=importlib, so the
# helpers above reach them as fixtures.


@pytest.fixture(scope="session")
def tool() -> Callable[[str], str]:
    """require_tool: a Debian-packaged tool's path, or a skip naming the package."""
    return require_tool


@pytest.fixture(scope="session")
def pick_port() -> Callable[..., int]:
    """free_port: a TCP port that was free a moment ago."""
    return free_port


@pytest.fixture(scope="session")
def workload() -> Callable[[str, int, int], acker_pb2.ApplyResponse]:
    """apply_workload: one Apply batch per call that acks, fails and leaves trees pending."""
    return apply_workload


@pytest.fixture(scope="session")
def describe_acker() -> Callable[[str], acker_pb2.DescribeResponse]:
    """describe: the Describe answer of an acker address."""
    return describe
