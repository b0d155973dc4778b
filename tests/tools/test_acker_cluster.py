"""ProcessCluster and the acker-cluster command: shard layout, crash reporting, restart, clean stop."""

from __future__ import annotations

import logging
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from acker_service import healthcheck
from acker_service.process_cluster import ClusterError, ProcessCluster

DEADLINE = 60.0


def _gone(pid: int) -> bool:
    """True when no process `pid` exists any more (reaped, not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    """Poll `predicate` until true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_shards_are_in_client_order(metrics_cluster: ProcessCluster, describe_acker: Callable) -> None:
    """Address i of the cluster is the acker that calls itself shard i of n."""
    for index, address in enumerate(metrics_cluster.addresses):
        reply = describe_acker(address)
        assert (reply.shard_index, reply.shard_count) == (index, 3)
    assert metrics_cluster.metrics_urls is not None
    assert len(set(metrics_cluster.metrics_urls)) == 3


@pytest.mark.chaos
def test_kill_and_restart_keep_shard_and_port(describe_acker: Callable) -> None:
    """A killed shard is reported dead, and restart() brings the same shard back on the same address."""
    with ProcessCluster(count=2, message_timeout=5.0) as cluster:
        address = cluster.addresses[1]
        before = describe_acker(address).incarnation
        cluster.kill(1)
        _wait_for(lambda: not cluster.is_alive(1), "shard 1 to die")
        assert not healthcheck.is_serving(address, timeout=1.0)
        cluster.restart(1)
        assert cluster.is_alive(1) and cluster.addresses[1] == address
        reply = describe_acker(address)
        assert (reply.shard_index, reply.shard_count) == (1, 2)
        assert reply.incarnation != before
        assert cluster.is_alive(0)


@pytest.mark.chaos
def test_restart_flag_revives_a_crashed_shard(caplog: pytest.LogCaptureFixture) -> None:
    """With restart=True a SIGKILLed shard is reported and comes back by itself on the same port."""
    caplog.set_level(logging.INFO, logger="acker_service.process_cluster")
    with ProcessCluster(count=1, restart=True) as cluster:
        old = cluster.pid(0)
        os.kill(old, signal.SIGKILL)  # a crash from outside, not via cluster.kill()
        _wait_for(lambda: "SERVING again" in caplog.text, "the watcher to restart shard 0")
        assert cluster.pid(0) != old
        assert healthcheck.is_serving(cluster.addresses[0])
    assert "exited unexpectedly with signal SIGKILL" in caplog.text


@pytest.mark.chaos
def test_requested_kill_is_not_reported_as_unexpected(caplog: pytest.LogCaptureFixture) -> None:
    """cluster.kill() is a crash the caller asked for: logged as requested, not as an unexpected exit."""
    caplog.set_level(logging.INFO, logger="acker_service.process_cluster")
    with ProcessCluster(count=1, restart=True) as cluster:
        cluster.kill(0)
        _wait_for(lambda: "SERVING again" in caplog.text, "the watcher to restart shard 0")
    assert "ended with signal SIGKILL, as requested by kill()" in caplog.text
    assert "exited unexpectedly" not in caplog.text


def test_stop_leaves_no_process_behind() -> None:
    """stop() terminates and reaps every child, including restarted ones, and removes its log dir."""
    cluster = ProcessCluster(count=2).start()
    cluster.restart(0)
    pids = [cluster.pid(0), cluster.pid(1)]
    log_dir = cluster.log_dir
    cluster.stop()
    assert all(_gone(pid) for pid in pids if pid is not None)
    assert log_dir is not None and not log_dir.exists()


def test_start_failure_names_the_shard_and_shows_its_output() -> None:
    """A shard that cannot bind its port makes start() raise with the child's own error, and nothing leaks."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = ProcessCluster(count=1, base_port=port)
        with pytest.raises(ClusterError) as info:
            cluster.start(timeout=DEADLINE)
    message = str(info.value)
    assert f"acker shard 0 (127.0.0.1:{port}) exited with exit code 2" in message
    assert str(port) in message.split("last output:", 1)[1]
    assert _gone(cluster.pid(0) or 0)


def test_invalid_count_is_refused() -> None:
    """A cluster of zero shards is a programming error caught at construction."""
    with pytest.raises(ValueError, match="count"):
        ProcessCluster(count=0)


# -- the acker-cluster command ------------------------------------------------


class Launcher:
    """An `acker-cluster` subprocess with its stdout line and stderr log."""

    def __init__(self, args: list[str], stderr_path: Path) -> None:
        script = Path(sys.executable).with_name("acker-cluster")
        cmd = [str(script)] if script.exists() else [sys.executable, "-m", "acker_cluster"]
        self.stderr_path = stderr_path
        with open(stderr_path, "wb") as err:
            self.proc = subprocess.Popen([*cmd, *args], stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)

    def first_line(self, timeout: float = DEADLINE) -> str:
        """The first line of stdout (the address list), read with a deadline."""
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                pytest.fail(f"acker-cluster printed nothing in {timeout}s:\n{self.stderr()}")
        return self.proc.stdout.readline().decode().strip()

    def stderr(self) -> str:
        """What the launcher wrote to stderr so far."""
        return self.stderr_path.read_text()

    def child_pids(self, count: int) -> list[int]:
        """The shard pids the launcher announced, in shard order."""
        _wait_for(lambda: len(re.findall(r"SERVING on \S+ \(pid \d+", self.stderr())) >= count, "pid lines")
        return [int(p) for p in re.findall(r"SERVING on \S+ \(pid (\d+)", self.stderr())[:count]]

    def stop(self) -> int:
        """SIGTERM the launcher and return its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=DEADLINE)

    def close(self) -> None:
        """Kill the launcher if a test left it running, and close the pipe."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Launcher]]:
    """Start acker-cluster subprocesses that are always cleaned up."""
    launchers: list[Launcher] = []

    def start(*args: str) -> Launcher:
        launcher = Launcher(list(args), tmp_path / f"launcher-{len(launchers)}.err")
        launchers.append(launcher)
        return launcher

    yield start
    for launcher in launchers:
        launcher.close()


def test_cli_prints_addresses_and_stops_cleanly(launch: Callable[..., Launcher], describe_acker: Callable) -> None:
    """acker-cluster prints one comma-separated line in shard order; SIGTERM stops every child, exit 0."""
    launcher = launch("--count", "3", "--base-port", "0", "--message-timeout", "5", "--", "--retain-outcomes", "50")
    addresses = launcher.first_line().split(",")
    assert len(addresses) == 3
    for index, address in enumerate(addresses):
        reply = describe_acker(address)
        assert (reply.shard_index, reply.shard_count, reply.message_timeout_seconds) == (index, 3, 5.0)
        assert reply.retain_outcomes == 50
    pids = launcher.child_pids(3)
    assert launcher.stop() == 0
    assert all(_gone(pid) for pid in pids), launcher.stderr()


@pytest.mark.chaos
def test_cli_reports_a_crashed_shard(launch: Callable[..., Launcher]) -> None:
    """kill -9 of a child makes the launcher say which shard died and how; the others keep serving."""
    launcher = launch("--count", "2", "--base-port", "0", "--restart")
    addresses = launcher.first_line().split(",")
    pids = launcher.child_pids(2)
    os.kill(pids[1], signal.SIGKILL)
    _wait_for(lambda: "exited unexpectedly" in launcher.stderr(), "the crash report")
    assert f"acker shard 1 (pid {pids[1]}, {addresses[1]}) exited unexpectedly with signal SIGKILL" in (
        launcher.stderr()
    )
    assert healthcheck.is_serving(addresses[0])
    assert launcher.stop() == 0
    assert _gone(pids[0])


@pytest.mark.chaos
def test_cli_restart_brings_the_shard_back_on_its_port(
    launch: Callable[..., Launcher], describe_acker: Callable
) -> None:
    """With --restart a killed child is restarted as the same shard on the same port and becomes healthy."""
    launcher = launch("--count", "2", "--base-port", "0", "--restart")
    addresses = launcher.first_line().split(",")
    pids = launcher.child_pids(2)
    os.kill(pids[0], signal.SIGKILL)
    _wait_for(lambda: "acker shard 0 is SERVING again" in launcher.stderr(), "the restart")
    new_pid = int(re.findall(r"shard 0 is SERVING again on \S+ \(pid (\d+)\)", launcher.stderr())[0])
    assert new_pid != pids[0]
    assert healthcheck.is_serving(addresses[0])
    assert describe_acker(addresses[0]).shard_index == 0
    assert launcher.stop() == 0
    assert _gone(new_pid) and _gone(pids[1])


def test_cli_flags_fall_back_to_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every acker-cluster flag reads ACKER_CLUSTER_* when not given, and --help names each variable."""
    from acker_cluster import cli as cluster_module

    monkeypatch.setenv("ACKER_CLUSTER_COUNT", "5")
    monkeypatch.setenv("ACKER_CLUSTER_METRICS_BASE_PORT", "9300")
    monkeypatch.setenv("ACKER_CLUSTER_RESTART", "0")
    monkeypatch.setenv("ACKER_CLUSTER_LAYOUT_DIR", "/srv/layouts")
    parser = cluster_module._parser()
    args = parser.parse_args([])
    assert (args.count, args.metrics_base_port, args.restart, args.layout_dir) == (5, 9300, False, "/srv/layouts")
    help_text = " ".join(parser.format_help().split())
    flags = ("COUNT", "HOST", "BASE_PORT", "METRICS_BASE_PORT", "MESSAGE_TIMEOUT", "BUCKETS", "RESTART", "LAYOUT_DIR")
    for flag in flags:
        assert f"ACKER_CLUSTER_{flag}" in help_text


# -- trusting only its own shards (issue 12) ------------------------------------


def _dead(pid: int) -> bool:
    """True when `pid` no longer runs: gone, or a zombie waiting for a reaper that is not its launcher."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _ackers_on_port(port: int) -> list[int]:
    """Pids of acker processes started with `--port <port>` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"acker_service" in args and b"--port" in args and args[args.index(b"--port") + 1] == str(port).encode():
            if not _dead(int(entry.name)):
                found.append(int(entry.name))
    return found


def test_cluster_on_ports_another_cluster_holds_fails() -> None:
    """The other cluster's health answers on the port, but start() confirms its own child, which cannot bind."""
    with ProcessCluster(count=1) as other:
        port = int(other.addresses[0].rsplit(":", 1)[1])
        cluster = ProcessCluster(count=1, base_port=port)
        with pytest.raises(ClusterError, match="exited with"):
            cluster.start(timeout=DEADLINE)
        assert _ackers_on_port(port) == [other.pid(0)]


def test_cli_on_taken_ports_fails_and_leaves_nothing_running(launch: Callable[..., Launcher]) -> None:
    """acker-cluster on another cluster's ports: no address line, no SERVING line, exit 1, no child left."""
    with ProcessCluster(count=1) as other:
        port = int(other.addresses[0].rsplit(":", 1)[1])
        launcher = launch("--count", "1", "--base-port", str(port))
        assert launcher.proc.wait(timeout=DEADLINE) == 1
        assert launcher.proc.stdout is not None and launcher.proc.stdout.read() == b""
        err = launcher.stderr()
        assert "SERVING" not in err
        # One line: what happened and the child's own last line.
        assert err.count("\n") == 1, err
        assert err.startswith("acker-cluster: could not start: acker shard 0") and "exited with" in err
        assert "the port is taken" in err
        assert _ackers_on_port(port) == [other.pid(0)]


@pytest.mark.chaos
def test_kill_9_of_the_launcher_leaves_no_shard(launch: Callable[..., Launcher]) -> None:
    """The children get a parent-death signal: SIGKILL of acker-cluster stops them too."""
    launcher = launch("--count", "2", "--base-port", "0")
    launcher.first_line()
    pids = launcher.child_pids(2)
    launcher.proc.kill()
    launcher.proc.wait()
    _wait_for(lambda: all(_dead(pid) for pid in pids), "the orphaned shards to stop")


@pytest.mark.chaos
def test_cli_restarts_a_dead_shard_by_default(launch: Callable[..., Launcher], describe_acker: Callable) -> None:
    """Issue 23: a shard killed under a plain `acker-cluster` used to stay dead (and a job hung 480 s on it)."""
    launcher = launch("--count", "2", "--base-port", "0")
    addresses = launcher.first_line().split(",")
    pids = launcher.child_pids(2)
    os.kill(pids[1], signal.SIGKILL)
    _wait_for(lambda: "acker shard 1 is SERVING again" in launcher.stderr(), "the restart")
    assert describe_acker(addresses[1]).shard_index == 1
    assert launcher.stop() == 0


@pytest.mark.chaos
def test_cli_with_no_restart_exits_when_a_shard_exits(launch: Callable[..., Launcher]) -> None:
    """--no-restart: one dead shard stops the launcher (exit 1, naming it) and every other shard."""
    launcher = launch("--count", "2", "--base-port", "0", "--no-restart")
    launcher.first_line()
    pids = launcher.child_pids(2)
    os.kill(pids[1], signal.SIGKILL)
    assert launcher.proc.wait(timeout=DEADLINE) == 1
    assert "acker shard 1 exited and --no-restart is set; stopping every shard" in launcher.stderr()
    _wait_for(lambda: _dead(pids[0]), "the other shard to stop")


@pytest.mark.parametrize("extra", [["--shard-count", "4"], ["--shard-index=1"], ["--port", "9999"]])
def test_cli_refuses_pass_through_flags_that_contradict_its_layout(
    launch: Callable[..., Launcher], extra: list[str]
) -> None:
    """Issue 23: `acker-cluster -- --shard-count 4` ran shards of 4 and reported "shard 0/3 SERVING"."""
    launcher = launch("--count", "3", "--base-port", "0", "--", *extra)
    assert launcher.proc.wait(timeout=DEADLINE) == 2
    assert launcher.proc.stdout is not None and launcher.proc.stdout.read() == b""
    err = launcher.stderr()
    assert f"{extra[0].split('=')[0]} is set per shard by the launcher; use its" in err and "SERVING" not in err


def test_process_cluster_refuses_extra_args_that_contradict_its_layout() -> None:
    with pytest.raises(ValueError, match="--shard-count is set per shard by the launcher; use its --count"):
        ProcessCluster(count=3, extra_args=["--shard-count", "4"])


def test_a_shard_restarted_from_a_short_lived_thread_outlives_it() -> None:
    """The parent-death signal follows the forking thread: children are forked by the cluster's own thread.

    The demo restarts a killed shard from its chaos thread, which then ends; the
    shard must keep serving.
    """
    with ProcessCluster(count=1) as cluster:
        worker = threading.Thread(target=cluster.restart, args=(0,))
        worker.start()
        task = Path(f"/proc/self/task/{worker.native_id}")
        worker.join()
        _wait_for(lambda: not task.exists(), "the restarting thread to end")
        # A child signalled at that thread's end would stop serving at once; probe it for a while.
        for _ in range(20):
            assert healthcheck.is_serving(cluster.addresses[0]), _tail_of(cluster)
            time.sleep(0.1)
        assert cluster.is_alive(0)


def _tail_of(cluster: ProcessCluster) -> str:
    return cluster.log_path(0).read_text()[-2000:]
