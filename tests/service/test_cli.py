"""The acker-server command: flags and ACKER_* fallbacks, the start line, SIGTERM, refusals."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from acker_service.cli import build_parser, config_from_args
from acker_service.config import ConfigError, ServerConfig

START_LINE = re.compile(
    r"^acker shard (\d+)/(\d+) serving on (127\.0\.0\.1:\d+), "
    r"(metrics on http://127\.0\.0\.1:\d+/metrics|metrics off), timeout ([\d.]+)s, (\d+) buckets, (native|reference) ledger engine, incarnation 0x[0-9a-f]{16}$"
)
FLAGS = (
    "host",
    "port",
    "shard_index",
    "shard_count",
    "replicas",
    "message_timeout",
    "buckets",
    "metrics_host",
    "metrics_port",
    "max_batch",
    "max_message_bytes",
    "retain_outcomes",
    "retain_seconds",
    "grace",
    "log_level",
)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    """Run `python -m acker_service` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "acker_service", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_help_lists_every_flag_with_its_env_var():
    """--help names each flag and its ACKER_* environment variable."""
    result = run_cli("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # argparse wraps lines
    for flag in FLAGS:
        assert f"--{flag.replace('_', '-')}" in text
        assert f"env ACKER_{flag.upper()}" in text


def test_env_vars_are_fallbacks_and_flags_win():
    """ACKER_* values become defaults; a flag on the command line overrides them."""
    parser = build_parser(
        {
            "ACKER_SHARD_COUNT": "4",
            "ACKER_SHARD_INDEX": "3",
            "ACKER_MESSAGE_TIMEOUT": "7.5",
            "ACKER_METRICS_PORT": "off",
            "ACKER_RETAIN_OUTCOMES": "10",
        }
    )
    config = config_from_args(parser.parse_args(["--shard-index", "2"]))
    assert (config.shard_count, config.shard_index, config.message_timeout) == (4, 2, 7.5)
    assert (config.metrics_port, config.retain_outcomes) == (None, 10)
    assert config_from_args(build_parser({}).parse_args([])) == ServerConfig()


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"shard_index": 3, "shard_count": 3}, "shard index must be 0..2"),
        ({"shard_count": 0}, "shard count must be at least 1"),
        ({"replicas": 3, "shard_count": 3}, "replicas must be 1 or 2"),
        ({"replicas": 2, "shard_count": 1}, "replicas 2 needs a shard count of at least 2"),
        ({"message_timeout": 0}, "message timeout must be a positive"),
        ({"buckets": 1}, "buckets must be at least 2"),
        ({"port": 70000}, "port must be 0..65535"),
        ({"max_batch": 0}, "max batch must be at least 1"),
        ({"retain_outcomes": 0}, "retain outcomes must be at least 1"),
        ({"retain_seconds": -1}, "retain seconds must be positive"),
        ({"grace": -1}, "grace must be zero or more"),
        ({"engine": "jvm"}, "engine must be one of native, reference"),
        ({"buckets": 40}, "the native engine supports at most 32 buckets"),
    ],
)
def test_config_validation_names_the_problem(overrides, fragment):
    """Each out-of-range setting is refused with a message naming it."""
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        ServerConfig(**overrides)


def test_bad_settings_exit_2_with_the_reason():
    """An invalid env value or setting exits 2 before binding anything."""
    result = run_cli("--shard-count", "2", env={"ACKER_SHARD_INDEX": "5"})
    assert result.returncode == 2
    assert "shard index must be 0..1" in result.stderr
    result = run_cli(env={"ACKER_BUCKETS": "three"})
    assert result.returncode == 2
    assert "ACKER_BUCKETS='three'" in result.stderr


def test_cli_serves_health_and_exits_0_on_sigterm():
    """The CLI logs the start line, answers health SERVING, and exits 0 on SIGTERM."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "acker_service",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--shard-index",
            "1",
            "--shard-count",
            "2",
            "--message-timeout",
            "5",
            "--grace",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline().rstrip("\n")
        match = START_LINE.match(line)
        assert match, f"unexpected start line: {line!r}"
        assert match.group(1, 2, 5, 6, 7) == ("1", "2", "5", "3", "native")
        with grpc.insecure_channel(match.group(3)) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "stopping" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.reference_engine
def test_start_line_without_metrics_says_off(make_server, engine):
    """With no metrics port the start line says 'metrics off'."""
    from acker_service.server import start_line

    server = make_server(message_timeout=30.0)
    line = start_line(server)
    assert START_LINE.match(line), line
    assert (
        line
        == f"acker shard 0/1 serving on {server.address}, metrics off, timeout 30s, 3 buckets, {engine} ledger engine, "
        f"incarnation {server.incarnation:#018x}"
    )


def test_taken_port_is_refused_with_exit_2(make_server):
    """A second acker on a port another server holds exits 2 with a clear message (no port sharing)."""
    holder = make_server()
    result = run_cli("--port", str(holder.port))
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{holder.port}" in result.stderr
    assert "port is taken" in result.stderr
    # One line: gRPC's own C++ log line about the failed bind is not shown first.
    assert result.stderr.strip().count("\n") == 0, result.stderr


def test_taken_metrics_port_is_refused_with_exit_2():
    """A metrics port held by another socket exits 2 and names the metrics address."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run_cli("--port", "0", "--metrics-port", str(port))
    assert result.returncode == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_server_whose_launcher_is_already_gone_does_not_start():
    """ACKER_EXIT_WITH_PARENT names the launcher; a server started after it died exits at once, in one line."""
    result = run_cli("--port", "0", env={"ACKER_EXIT_WITH_PARENT": "1"})  # pid 1 is never this test's process
    assert result.returncode == 1
    assert result.stderr.strip() == "acker-server: the launcher (pid 1) is gone; not starting"


_SIGNAL_ON_ANOTHER_THREAD = """
import logging, signal, sys, threading, time
from acker_service.config import ServerConfig
from acker_service.server import serve

started = threading.Event()

class StartLine(logging.Handler):
    def emit(self, record):
        if "serving on" in record.getMessage():
            started.set()

logging.getLogger("acker_service").addHandler(StartLine())
logging.getLogger("acker_service").setLevel(logging.INFO)

def poke():
    started.wait(60)
    time.sleep(0.2)  # the main thread goes from the start line to waiting for the stop signal
    # The kernel may hand a process-directed SIGTERM to any thread; here, deliberately, not the main one.
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=poke).start()
serve(ServerConfig(host="127.0.0.1", port=0, shard_index=0, shard_count=1, grace=0.5))
print("stopped")
"""


def test_sigterm_delivered_to_another_thread_still_stops_the_server():
    """A SIGTERM the kernel hands to a non-main thread (a gRPC poller, say) stops the server, not a hang."""
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_ON_ANOTHER_THREAD], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and "stopped" in done.stdout, done.stderr[-2000:]


def test_join_comes_from_the_flag_or_acker_join():
    """--join 1 or ACKER_JOIN=1 lets a StatefulSet pod beyond the shard count start outside the layout."""
    assert config_from_args(
        build_parser({}).parse_args(["--shard-index", "3", "--shard-count", "3", "--join", "1"])
    ).join
    env = {"ACKER_JOIN": "yes", "ACKER_SHARD_INDEX": "4", "ACKER_SHARD_COUNT": "3"}
    assert not config_from_args(build_parser(env).parse_args([])).in_layout
    with pytest.raises(SystemExit):
        build_parser({"ACKER_JOIN": "maybe"})
