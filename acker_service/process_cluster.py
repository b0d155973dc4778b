"""A local acker cluster: n acker processes with one consistent shard configuration.

`ProcessCluster` starts shard i of n as `python -m acker_service --shard-index i
--shard-count n ...`, waits until every shard it started is serving (its own
child, not whatever answers on the port: see `_confirm`), watches the children,
and stops them all. The children die with the launcher, even a `kill -9`ed one
(Linux: a parent-death signal; elsewhere a clean stop is needed). The `acker-cluster` console script
(``tools/acker_cluster``, :mod:`acker_cluster.cli`) wraps it for operators; the demo and the tests use the class directly (kill a
shard, restart it on the same ports).

Clients must list the ackers in shard order (root id % n picks the shard), which
is the order of `ProcessCluster.addresses` and of the line `acker-cluster` prints.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import grpc
from acker_protocol import grpc_options
from acker_protocol.credentials import ChannelSecurity, open_channel
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from acker_service import healthcheck

__all__ = ["ProcessCluster", "ClusterError"]

log = logging.getLogger(__name__)

# Per-shard settings the cluster passes as flags; the same names in the
# launcher's environment would otherwise reach every child (server flags fall
# back to ACKER_* variables) and, e.g., put all shards on one metrics port.
_PER_SHARD_ENV = (
    "ACKER_SHARD_INDEX",
    "ACKER_SHARD_COUNT",
    "ACKER_HOST",
    "ACKER_PORT",
    "ACKER_METRICS_PORT",
    "ACKER_LAYOUT_FILE",
)
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")
_POLL_SECONDS = 0.05
_TAIL_LINES = 20
# Auto-chosen ports can be taken by someone else between choosing and binding.
_PORT_RACE_ATTEMPTS = 3
# A shard that keeps crashing is restarted with a growing delay, capped here.
_MAX_RESTART_DELAY = 30.0


class ClusterError(RuntimeError):
    """A shard did not start, died during start, or did not become healthy in time.

    ``str()`` holds the child's last output lines; ``headline`` is one line (what
    happened and the child's last line), for a command's error message.
    """

    def __init__(self, what: str, output: str = "", label: str = "last output") -> None:
        super().__init__(f"{what}; {label}:\n{output}" if output else what)
        last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "")
        self.headline = f"{what}: {last}" if last else what


@dataclass
class _Shard:
    """One child acker: its fixed ports and its current process."""

    index: int
    port: int
    metrics_port: int | None
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    # Set while the cluster itself stops or replaces the process, so the
    # watcher does not mistake that exit for a crash.
    intentional: bool = False
    # Set by kill(): the exit is a crash the caller asked for (tests, the demo),
    # reported as such rather than as an unexpected failure.
    killed_by_request: bool = False
    reported: bool = False
    crashes: int = 0
    restart_at: float | None = None
    pids: list[int] = field(default_factory=list)
    # Where the current child's output starts in log_path (the file is appended across restarts).
    log_offset: int = 0


# The child's start line (acker_service.server.start_line): its shard and incarnation.
_START_LINE = re.compile(r"acker shard (\d+)/(\d+) serving on .*, incarnation (0x[0-9a-f]+)")


class _Spawner:
    """Forks every child from one thread that lives as long as the cluster.

    Linux sends the parent-death signal when the *thread* that forked the child
    ends, not the process: a shard restarted from a short-lived thread (the
    demo's chaos thread, a caller's worker) would get SIGTERM as soon as that
    thread returned. This thread ends only after the children are stopped.
    """

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Any, threading.Event, list[Any]] | None] = queue.SimpleQueue()
        # The target holds only the queue: the thread must not keep the cluster alive.
        self.thread = threading.Thread(
            target=_serve_spawns, args=(self.jobs,), name="acker-cluster-spawner", daemon=True
        )
        self.thread.start()
        self.closed = False

    def close(self) -> None:
        """End the thread (after the children it forked were stopped)."""
        self.closed = True
        self.jobs.put(None)

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the spawner thread and return its result (or raise its error)."""
        if self.closed:
            raise RuntimeError("this cluster was stopped")
        if threading.current_thread() is self.thread:
            return fn()
        done, box = threading.Event(), cast(list[tuple[bool, Any]], [])
        self.jobs.put((fn, done, box))
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value


def _serve_spawns(jobs: queue.SimpleQueue[tuple[Any, threading.Event, list[Any]] | None]) -> None:
    while (job := jobs.get()) is not None:
        fn, done, box = job
        try:
            box.append((True, fn()))
        except BaseException as err:  # handed to the caller, which raises it
            box.append((False, err))
        done.set()


def _read_from(path: Path, offset: int) -> str:
    """The text of ``path`` from byte ``offset`` (empty if there is none yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports that were free on `host` a moment ago (all held open while choosing)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(_family(host), socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def _family(host: str) -> socket.AddressFamily:
    """The socket family for binding `host`."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _connect_host(host: str) -> str:
    """The host clients and probes on this machine use to reach a server bound to `host`."""
    if host in _WILDCARD_HOSTS:
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """The last `lines` lines of a child's log (empty if there is none yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _describe_exit(returncode: int) -> str:
    """'exit code 2' or 'signal SIGKILL' for a Popen return code."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _reap_all(procs: list[subprocess.Popen[bytes]], spawns: queue.SimpleQueue[Any] | None = None) -> None:
    """Last-resort cleanup at garbage collection or interpreter exit: kill and reap leftovers, end the spawner."""
    if spawns is not None:
        spawns.put(None)
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


# acker-server flags the launcher sets per shard, and the launcher's own flag for each:
# passed through in extra_args they would contradict the layout it announces.
LAUNCHER_OWNED_FLAGS = {
    "--shard-index": "--count",
    "--shard-count": "--count",
    "--host": "--host",
    "--port": "--base-port",
    "--metrics-port": "--metrics-base-port",
    "--message-timeout": "--message-timeout",
    "--buckets": "--buckets",
    "--layout-file": "--layout-dir",  # one file per acker: a shared one would give every child the same shard
    "--peers": "--replicas 2 (each acker is given the others' addresses)",
}


def layout_conflicts(extra_args: Sequence[str]) -> list[str]:
    """One line per extra acker-server argument that sets what the launcher sets per shard (empty: none)."""
    found = []
    for arg in extra_args:
        flag = str(arg).split("=", 1)[0]
        if flag in LAUNCHER_OWNED_FLAGS:
            found.append(f"{flag} is set per shard by the launcher; use its {LAUNCHER_OWNED_FLAGS[flag]} instead")
    return found


class ProcessCluster:
    """n acker processes on this machine, shard i of n each; use as a context manager.

    >>> with ProcessCluster(count=3, metrics_base_port=0) as cluster:
    ...     client = ClusterClient(cluster.addresses)

    base_port None chooses free ports; otherwise shard i listens on base_port + i.
    metrics_base_port None turns metrics off, 0 chooses free ports, otherwise
    shard i serves metrics on metrics_base_port + i. extra_args go to every
    child verbatim (e.g. ("--retain-outcomes", "1000")). With restart=True a
    watcher thread restarts any child that exits while the cluster runs,
    including one stopped by kill(), which simulates a crash. Each child's
    output goes to shard-<i>.log in log_dir (a temporary directory, removed on
    stop, when log_dir is None). ``security`` is how this object's own health
    probes reach children started with TLS flags in extra_args. With
    ``layout_dir`` shard i keeps its committed layout in
    ``layout_dir/shard-<i>.layout.json`` (``--layout-file``), so a child
    restarted after a reshard comes back in the layout it had.
    """

    def __init__(
        self,
        count: int = 3,
        host: str = "127.0.0.1",
        base_port: int | None = None,
        metrics_base_port: int | None = None,
        message_timeout: float = 30.0,
        buckets: int = 3,
        extra_args: Sequence[str] = (),
        restart: bool = False,
        log_dir: str | os.PathLike[str] | None = None,
        security: ChannelSecurity | None = None,
        layout_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        conflicts = layout_conflicts(extra_args)
        if conflicts:
            raise ValueError("extra acker-server arguments contradict the cluster's layout: " + "; ".join(conflicts))
        self.count = count
        self.host = host
        self.base_port = base_port or None
        self.metrics_base_port = metrics_base_port
        self.message_timeout = message_timeout
        self.buckets = buckets
        self.extra_args = tuple(str(a) for a in extra_args)
        self.restart_on_exit = restart
        self.security = security
        self.layout_dir = Path(layout_dir) if layout_dir is not None else None
        self._own_log_dir = log_dir is None
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._shards: list[_Shard] = []
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        # Every Popen ever made, for the last-resort finalizer (must not reference self).
        self._procs: list[subprocess.Popen[bytes]] = []
        self._spawner = _Spawner()
        self._finalizer = weakref.finalize(self, _reap_all, self._procs, self._spawner.jobs)

    # -- public API ---------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        """host:port of every shard, in shard order: the order clients must use."""
        host = _connect_host(self.host)
        return [f"{host}:{s.port}" for s in self._shards]

    @property
    def metrics_urls(self) -> list[str] | None:
        """The /metrics URL of every shard in shard order, or None when metrics are off."""
        if self.metrics_base_port is None:
            return None
        host = _connect_host(self.host)
        return [f"http://{host}:{s.metrics_port}/metrics" for s in self._shards]

    @property
    def log_dir(self) -> Path | None:
        """The directory holding shard-<i>.log, once started."""
        return self._log_dir

    def log_path(self, shard: int) -> Path:
        """The file that receives shard `shard`'s stdout and stderr."""
        return self._shards[shard].log_path

    def layout_file(self, shard: int) -> Path:
        """Where shard ``shard`` keeps its committed layout (ValueError without a layout_dir)."""
        if self.layout_dir is None:
            raise ValueError("this cluster keeps no layout files (no layout_dir)")
        return self.layout_dir / f"shard-{shard}.layout.json"

    def pid(self, shard: int) -> int | None:
        """The process id of shard `shard`'s current child, if one was started."""
        proc = self._shards[shard].process
        return proc.pid if proc is not None else None

    def start(self, timeout: float = 30.0) -> ProcessCluster:
        """Spawn every shard and return once all are SERVING; on failure stop them all and raise."""
        if self._shards:
            raise RuntimeError("this cluster was already started")
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="acker-cluster-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        if self.layout_dir is not None:
            self.layout_dir.mkdir(parents=True, exist_ok=True)
        attempts = _PORT_RACE_ATTEMPTS if self._ports_are_chosen() else 1
        for attempt in range(1, attempts + 1):
            self._shards = self._plan_shards()
            try:
                self._spawn_all()
                self._wait_all_healthy(timeout)
                break
            except BaseException as err:
                # Whatever interrupted the start (a dead shard, a timeout, Ctrl-C),
                # no child may outlive it.
                self._terminate_all(grace=2.0)
                if attempt == attempts or not isinstance(err, ClusterError):
                    self._cleanup_logs()
                    raise
                log.info("a shard failed to start on auto-chosen ports; retrying with new ports")
        self._stopping.clear()
        self._watcher = threading.Thread(target=self._watch, name="acker-cluster-watcher", daemon=True)
        self._watcher.start()
        return self

    def is_alive(self, shard: int) -> bool:
        """True while shard `shard`'s current child process is running."""
        proc = self._shards[shard].process
        return proc is not None and proc.poll() is None

    def kill(self, shard: int, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to shard `shard` as a crash would (restart=True brings it back)."""
        with self._lock:
            target = self._shards[shard]
            proc = target.process
            if proc is not None and proc.poll() is None:
                target.killed_by_request = True
                proc.send_signal(sig)

    def restart(self, shard: int, timeout: float = 30.0) -> None:
        """Stop shard `shard` if it runs, start it again on the same ports, and wait until SERVING."""
        with self._lock:
            target = self._shards[shard]
            self._stop_shard(target, grace=5.0)
            self._spawn(target)
            target.reported = False
            target.restart_at = None
        self._wait_healthy([target], timeout)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every child, wait up to `grace` seconds, SIGKILL stragglers, reap them all."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        self._terminate_all(grace)
        self._spawner.close()  # after the children: its end would signal any still running
        self._cleanup_logs()

    def __enter__(self) -> ProcessCluster:
        if not self._shards:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- starting -----------------------------------------------------------

    def _ports_are_chosen(self) -> bool:
        """True when some ports are picked by the cluster (so a bind race can be retried)."""
        return self.base_port is None or self.metrics_base_port == 0

    def _plan_shards(self) -> list[_Shard]:
        """Fix each shard's ports: given bases plus the shard index, or free ports."""
        # One call picks every free port needed, so no two shards get the same one.
        wanted = (self.base_port is None) + (self.metrics_base_port == 0)
        free = iter(_free_ports(self.host, self.count * wanted))
        if self.base_port is not None:
            ports = [self.base_port + i for i in range(self.count)]
        else:
            ports = [next(free) for _ in range(self.count)]
        metrics: list[int | None]
        if self.metrics_base_port is None:
            metrics = [None] * self.count
        elif self.metrics_base_port == 0:
            metrics = [next(free) for _ in range(self.count)]
        else:
            metrics = [self.metrics_base_port + i for i in range(self.count)]
        assert self._log_dir is not None
        return [
            _Shard(index=i, port=ports[i], metrics_port=metrics[i], log_path=self._log_dir / f"shard-{i}.log")
            for i in range(self.count)
        ]

    def _command(self, shard: _Shard) -> list[str]:
        """The child's command line for `shard`."""
        cmd = [
            sys.executable, "-m", "acker_service",
            "--shard-index", str(shard.index),
            "--shard-count", str(self.count),
            "--host", self.host,
            "--port", str(shard.port),
            "--message-timeout", repr(float(self.message_timeout)),
            "--buckets", str(self.buckets),
        ]  # fmt: skip
        if shard.metrics_port is not None:
            cmd += ["--metrics-port", str(shard.metrics_port)]
        if self.layout_dir is not None:
            cmd += ["--layout-file", str(self.layout_file(shard.index))]
        if self.replicas == 2 and shard.pids:
            # A restarted acker copies its two ranges from its partners (catch-up) before it applies anything;
            # at the cluster's first start there is nothing to copy, so no acker waits for its partners.
            cmd += ["--peers", ",".join(self.addresses)]
        return cmd + list(self.extra_args)

    @property
    def replicas(self) -> int:
        """The replication factor the children get from extra_args (``--replicas``), 1 when not given."""
        args = list(self.extra_args)
        for i, arg in enumerate(args):
            if arg == "--replicas" and i + 1 < len(args):
                return int(args[i + 1]) if args[i + 1].isdigit() else 1
            if arg.startswith("--replicas="):
                value = arg.split("=", 1)[1]
                return int(value) if value.isdigit() else 1
        return 1

    def _child_env(self) -> dict[str, str]:
        """The launcher's environment without the per-shard ACKER_* settings, unbuffered."""
        env = {k: v for k, v in os.environ.items() if k not in _PER_SHARD_ENV}
        env["PYTHONUNBUFFERED"] = "1"
        # The child asks for a parent-death signal (acker_service.cli.exit_with_parent), so a
        # launcher killed with kill -9 leaves no shard behind.
        env["ACKER_EXIT_WITH_PARENT"] = str(os.getpid())
        return env

    def _spawn(self, shard: _Shard) -> None:
        """Start `shard`'s child with its output appended to its log file."""
        shard.killed_by_request = False
        with open(shard.log_path, "ab") as out:
            shard.log_offset = out.tell()
            # The child gets a duplicate of the descriptor; ours closes here, so
            # nothing stays open in the launcher. start_new_session puts the
            # child in its own process group: a terminal's Ctrl-C reaches only
            # the launcher, which then stops every child exactly once.
            popen = partial(
                subprocess.Popen,
                self._command(shard),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._child_env(),
                start_new_session=True,
            )
            proc = self._spawner.call(popen)
        shard.process = proc
        shard.intentional = False
        shard.pids.append(proc.pid)
        self._procs.append(proc)

    def _spawn_all(self) -> None:
        """Start every planned shard."""
        with self._lock:
            for shard in self._shards:
                self._spawn(shard)

    def _wait_all_healthy(self, timeout: float) -> None:
        """Wait until every shard is SERVING (see _wait_healthy)."""
        self._wait_healthy(self._shards, timeout)

    def _wait_healthy(self, shards: Sequence[_Shard], timeout: float, cancel: threading.Event | None = None) -> bool:
        """Poll the shards' health until all are SERVING; raise ClusterError if one dies or time runs out.

        Returns False only when `cancel` was set before the shards became healthy.
        """
        deadline = time.monotonic() + timeout
        waiting = list(shards)
        while waiting:
            if cancel is not None and cancel.is_set():
                return False
            for shard in list(waiting):
                self._raise_if_dead(shard)
                if self._confirm(shard):
                    waiting.remove(shard)
            if waiting and time.monotonic() > deadline:
                shard = waiting[0]
                raise ClusterError(
                    f"acker shard {shard.index} on {self._address(shard)} was not SERVING after {timeout:g}s",
                    _tail(shard.log_path),
                )
            if waiting:
                time.sleep(_POLL_SECONDS)
        return True

    def _confirm(self, shard: _Shard) -> bool:
        """True once `shard`'s own child serves: it printed its start line, and the port answers as that child.

        Another server already on the port (a second cluster started on the same
        ports) answers health checks too; only the child's own Describe returns
        the shard and incarnation the child printed, and then it must be alive.
        """
        match = _START_LINE.search(_read_from(shard.log_path, shard.log_offset))
        if match is None:
            return False
        index, count, incarnation = int(match[1]), int(match[2]), int(match[3], 16)
        address = self._address(shard)
        if not healthcheck.is_serving(address, timeout=1.0, security=self.security):
            return False
        try:
            with open_channel(address, self.security, grpc_options.client_options()) as channel:
                reply = acker_pb2_grpc.AckerStub(channel).Describe(acker_pb2.DescribeRequest(), timeout=1.0)
        except grpc.RpcError:
            return False
        if (reply.shard_index, reply.shard_count, reply.incarnation) != (index, count, incarnation):
            raise ClusterError(
                f"acker shard {shard.index}: another server answers on {address} "
                f"(shard {reply.shard_index}/{reply.shard_count}, not the child this cluster started)",
                _tail(shard.log_path),
                "the child's output",
            )
        self._raise_if_dead(shard)
        return True

    def _raise_if_dead(self, shard: _Shard) -> None:
        """Raise ClusterError with the child's output tail if `shard`'s process has exited."""
        proc = shard.process
        code = proc.poll() if proc is not None else None
        if proc is not None and code is not None:
            raise ClusterError(
                f"acker shard {shard.index} ({self._address(shard)}) exited with {_describe_exit(code)} while starting",
                _tail(shard.log_path),
            )

    def _address(self, shard: _Shard) -> str:
        """host:port a local probe uses for `shard`."""
        return f"{_connect_host(self.host)}:{shard.port}"

    # -- watching -----------------------------------------------------------

    def _watch(self) -> None:
        """Report children that exit on their own; with restart on, bring them back."""
        while not self._stopping.wait(0.1):
            for shard in self._shards:
                revived = self._check_shard(shard)
                if revived and not self._await_revival(shard):
                    return

    def _check_shard(self, shard: _Shard) -> bool:
        """Report an unexpected exit once; return True if the shard was just respawned."""
        with self._lock:
            proc = shard.process
            if proc is None or shard.intentional or self._stopping.is_set():
                return False
            code = proc.poll()
            if code is None:
                return False
            if not shard.reported:
                shard.reported = True
                shard.crashes += 1
                self._report_exit(shard, code)
                if self.restart_on_exit:
                    delay = min(0.5 * 2 ** (shard.crashes - 1), _MAX_RESTART_DELAY) if shard.crashes > 1 else 0
                    shard.restart_at = time.monotonic() + delay
            if shard.restart_at is None or time.monotonic() < shard.restart_at:
                return False
            log.warning("restarting acker shard %d on %s", shard.index, self._address(shard))
            self._spawn(shard)
            shard.reported = False
            shard.restart_at = None
            return True

    def _report_exit(self, shard: _Shard, code: int) -> None:
        """Log that `shard` exited unexpectedly, with the tail of its output."""
        if shard.killed_by_request:
            log.warning(
                "acker shard %d (%s) ended with %s, as requested by kill()",
                shard.index, self._address(shard), _describe_exit(code),
            )  # fmt: skip
            return
        log.error(
            "acker shard %d (pid %d, %s) exited unexpectedly with %s; last output:\n%s",
            shard.index, shard.process.pid if shard.process else -1, self._address(shard),
            _describe_exit(code), _tail(shard.log_path, 5),
        )  # fmt: skip

    def _await_revival(self, shard: _Shard) -> bool:
        """Wait for a respawned shard to serve; False if the cluster is stopping meanwhile."""
        try:
            if not self._wait_healthy([shard], timeout=60.0, cancel=self._stopping):
                return False
        except ClusterError as err:
            # The watcher reports the new exit on its next pass; nothing more to do here.
            log.debug("restart of shard %d failed: %s", shard.index, err)
            return True
        # Serving again ends a crash loop: the next crash restarts without delay.
        shard.crashes = 0
        pid = shard.process.pid if shard.process else -1
        log.warning("acker shard %d is SERVING again on %s (pid %d)", shard.index, self._address(shard), pid)
        return True

    # -- stopping -----------------------------------------------------------

    def _stop_shard(self, shard: _Shard, grace: float) -> None:
        """SIGTERM one child, SIGKILL it after `grace` seconds, and reap it."""
        proc = shard.process
        if proc is None:
            return
        shard.intentional = True
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        self._reap(proc, grace)

    def _terminate_all(self, grace: float) -> None:
        """SIGTERM all children at once, then wait for each within one shared grace period."""
        with self._lock:
            for shard in self._shards:
                if shard.process is not None:
                    shard.intentional = True
                    if shard.process.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            shard.process.terminate()
            deadline = time.monotonic() + grace
            for shard in self._shards:
                if shard.process is not None:
                    self._reap(shard.process, max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes], grace: float) -> None:
        """Wait for `proc` up to `grace` seconds, then SIGKILL and wait for good."""
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log.warning("acker pid %d ignored SIGTERM for %.1fs; killing it", proc.pid, grace)
            proc.kill()
            proc.wait()

    def _cleanup_logs(self) -> None:
        """Remove the temporary log directory the cluster made for itself."""
        if self._own_log_dir and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
