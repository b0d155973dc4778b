"""acker-healthcheck reports SERVING with exit 0 and anything else with a nonzero exit."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from acker_service import healthcheck
from acker_service.process_cluster import ProcessCluster


@pytest.fixture
def not_serving_server() -> Iterator[str]:
    """A gRPC server whose health service says NOT_SERVING (as an acker does while shutting down)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()


def test_exit_zero_against_a_healthy_acker(metrics_cluster: ProcessCluster, capsys: pytest.CaptureFixture[str]) -> None:
    """A running acker answers SERVING, and main() returns 0 and prints the status."""
    address = metrics_cluster.addresses[0]
    assert healthcheck.main(["--address", address]) == 0
    assert capsys.readouterr().out.strip() == f"{address}: SERVING"


def test_nonzero_against_a_closed_port(pick_port: Callable[[], int], capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listening: exit 1 with UNAVAILABLE on stderr, well before the timeout."""
    address = f"127.0.0.1:{pick_port()}"
    assert healthcheck.main(["--address", address, "--timeout", "5"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_nonzero_when_not_serving(not_serving_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A server that answers NOT_SERVING is unhealthy: exit 1."""
    assert healthcheck.main(["--address", not_serving_server]) == 1
    assert "NOT_SERVING" in capsys.readouterr().out


def test_unknown_service_name_is_unhealthy(metrics_cluster: ProcessCluster) -> None:
    """Asking for a service the acker does not register fails (NOT_FOUND), so a typo cannot pass."""
    assert healthcheck.main(["--address", metrics_cluster.addresses[0], "--service", "no.such.Service"]) == 1


def test_console_script_exit_codes(metrics_cluster: ProcessCluster, pick_port: Callable[[], int]) -> None:
    """The installed acker-healthcheck binary (what compose runs) exits 0 healthy and 1 on a closed port."""
    script = Path(sys.executable).with_name("acker-healthcheck")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "acker_service.healthcheck"]
    ok = subprocess.run([*cmd, "--address", metrics_cluster.addresses[1]], capture_output=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    closed = subprocess.run([*cmd, "--address", f"127.0.0.1:{pick_port()}"], capture_output=True, timeout=60)
    assert closed.returncode == 1, closed.stderr


def test_default_address_follows_acker_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --address the probe targets 127.0.0.1:$ACKER_PORT, as the image's HEALTHCHECK relies on."""
    monkeypatch.delenv("ACKER_HEALTHCHECK_ADDRESS", raising=False)
    monkeypatch.setenv("ACKER_PORT", "7345")
    assert healthcheck._parser().parse_args([]).address == "127.0.0.1:7345"
