"""Test helper: a throwaway Spark standalone cluster whose workers look like separate hosts.

Spark never runs a speculative copy of a task on a host that already runs an
attempt of it, and ``local[N]`` is one host, so speculation cannot happen
there. :class:`StandaloneCluster` starts a master and workers from the
installed pyspark's jars, each worker on its own loopback address (127.0.0.1,
127.0.0.2, ...; Linux routes all of 127.0.0.0/8 to the loopback device), so a
job can exercise speculative execution on one machine.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["StandaloneCluster", "loopback_hosts", "can_bind"]

_DAEMON_JAVA_OPTS = (
    "-Xmx256m",
    # Short-lived daemons: the client compiler and serial GC start fastest.
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    # The REST submission server binds a fixed port (6066) that parallel runs would fight over.
    "-Dspark.master.rest.enabled=false",
)
_POLL_SECONDS = 0.1


def loopback_hosts(count: int) -> list[str]:
    """``count`` distinct loopback addresses: 127.0.0.1, 127.0.0.2, ..."""
    return [f"127.0.0.{i + 1}" for i in range(count)]


def can_bind(host: str) -> bool:
    """True if a TCP socket can bind ``host`` on this machine (not every OS routes all of 127/8)."""
    try:
        with socket.socket() as sock:
            sock.bind((host, 0))
    except OSError:
        return False
    return True


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _scala_version(spark_home: Path) -> str:
    # The worker's launcher needs it to build executor commands; pip's pyspark has
    # no build directories to infer it from, so read it from the spark-core jar name.
    for jar in (spark_home / "jars").glob("spark-core_*.jar"):
        return jar.name.split("_", 1)[1].split("-", 1)[0]
    raise FileNotFoundError(f"no spark-core jar under {spark_home / 'jars'}: is pyspark installed fully?")


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java:
        raise FileNotFoundError("no java on PATH and JAVA_HOME is not set: Spark needs Java 17 or later")
    return java


class StandaloneCluster:
    """One Spark master and ``workers`` workers on distinct loopback hosts, for tests on one machine.

    >>> with StandaloneCluster(workers=2, cores=2) as cluster:  # doctest: +SKIP
    ...     spark = local_session(cluster.master_url, extra_conf=cluster.session_conf())

    Logs and work directories go to ``work_dir`` (a temp dir removed at stop when
    not given). Processes are stopped by :meth:`stop`; executors follow their worker.
    """

    def __init__(
        self,
        workers: int = 2,
        cores: int = 2,
        *,
        worker_memory: str = "1g",
        executor_memory: str = "512m",
        work_dir: str | Path | None = None,
    ) -> None:
        if workers < 1 or cores < 1:
            raise ValueError(f"need at least one worker and one core, got {workers} and {cores}")
        self.hosts = loopback_hosts(workers)
        unbindable = [h for h in self.hosts if not can_bind(h)]
        if unbindable:
            raise OSError(f"cannot bind {', '.join(unbindable)}: this OS does not route all of 127/8 to loopback")
        self.cores = cores
        self.worker_memory = worker_memory
        self.executor_memory = executor_memory
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="spark-standalone-"))
        self.master_port = 0
        self._ui_port = 0
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT`` (valid once started)."""
        return f"spark://127.0.0.1:{self.master_port}"

    def session_conf(self) -> dict[str, str]:
        """SparkSession settings for this cluster: one executor per worker, wait until all have registered."""
        return {
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * len(self.hosts)),
            "spark.executor.memory": self.executor_memory,
            "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
            # Without these the first job can start before every executor is up,
            # and all its tasks land on one host.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
            "spark.driver.host": "127.0.0.1",
        }

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker is registered with the master."""
        self.master_port, self._ui_port = _free_port(), _free_port()
        try:
            self._launch(
                "master",
                "org.apache.spark.deploy.master.Master",
                ["--host", "127.0.0.1", "--port", str(self.master_port), "--webui-port", str(self._ui_port)],
                host="127.0.0.1",
            )
            # Workers that find no master back off for several seconds: start them once it listens.
            self._wait(timeout, self._master_listens, "the Spark master to listen")
            for index, host in enumerate(self.hosts):
                args = ["--host", host, "--port", "0", "--webui-port", "0", "--cores", str(self.cores)]
                args += ["--memory", self.worker_memory, "--work-dir", str(self.work_dir / f"worker-{index}")]
                self._launch(
                    f"worker-{index}", "org.apache.spark.deploy.worker.Worker", [*args, self.master_url], host=host
                )
            self._wait(timeout, lambda: self._alive_workers() == len(self.hosts), "every Spark worker to register")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every daemon (workers first), SIGKILL what outlives ``grace``; remove an owned work dir."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self._procs):
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of every daemon's log (for error messages)."""
        parts = []
        for path in sorted(self.work_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def _launch(self, name: str, main_class: str, args: list[str], *, host: str) -> None:
        spark_home = _spark_home()
        env = dict(os.environ)
        # SPARK_HOME and the Scala version let the worker build executor commands;
        # SPARK_LOCAL_IP makes the daemon (and its executors) bind its own loopback host.
        env.update(SPARK_HOME=str(spark_home), SPARK_SCALA_VERSION=_scala_version(spark_home), SPARK_LOCAL_IP=host)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        classpath = str(spark_home / "jars" / "*")
        with open(self.work_dir / f"{name}.log", "wb") as log:
            self._procs.append(
                subprocess.Popen(
                    [_java(), *_DAEMON_JAVA_OPTS, "-cp", classpath, main_class, *args],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )

    def _master_listens(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.master_port), timeout=1.0).close()
        except OSError:
            return False
        return True

    def _alive_workers(self) -> int:
        # The master UI's JSON view lists the registered workers.
        url = f"http://127.0.0.1:{self._ui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=2.0) as response:
                state: dict[str, Any] = json.load(response)
        except (OSError, ValueError):  # not listening yet, or a UI still starting answers an empty page
            return 0
        return int(state.get("aliveworkers", 0))

    def _wait(self, timeout: float, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if any(p.poll() is not None for p in self._procs):
                raise RuntimeError(f"a Spark daemon exited while waiting for {what}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.log_tail()}")
            time.sleep(_POLL_SECONDS)
