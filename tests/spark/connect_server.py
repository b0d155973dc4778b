"""A real local Spark Connect server in a subprocess (``spark-submit`` of PySpark's SparkConnectServer)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from acker_spark.session import _log4j2_file

__all__ = ["ConnectServer"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ConnectServer:
    """Starts ``SparkConnectServer`` on a free loopback port with ``master``; its Python workers run this interpreter.

    The workers import the project through this process's PYTHONPATH (the test
    run's), so bolts shipped by reference resolve there as they do in local Spark.
    """

    def __init__(self, log_path: Path, master: str = "local[2,4]") -> None:
        import pyspark

        self.spark_home = Path(pyspark.__file__).parent
        self.port = _free_port()
        self.master = master
        self.log_path = log_path
        self._log: IO[bytes] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``sc://`` URL clients connect to."""
        return f"sc://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> ConnectServer:
        """Launch the server and wait until its port accepts connections (RuntimeError with its log if not)."""
        env = dict(
            os.environ, PYSPARK_PYTHON=sys.executable, SPARK_HOME=str(self.spark_home), SPARK_LOCAL_IP="127.0.0.1"
        )
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), *sys.path) if p)
        command = [
            str(self.spark_home / "bin" / "spark-submit"),
            "--class",
            SERVER_CLASS,
            "--master",
            self.master,
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.grpc.binding.port={self.port}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=4",
            "--conf",
            "spark.default.parallelism=4",
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            "--conf",
            f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:{_log4j2_file()}",
            "spark-internal",
        ]
        self._log = self.log_path.open("wb")
        # A session of its own: stop() signals the server's whole process group, and nothing else.
        self._process = subprocess.Popen(
            command, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"Spark Connect server did not start on port {self.port}: {self.log_path.read_text()[-3000:]}"
        )

    def stop(self) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL if it lingers)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
        if self._log is not None:
            self._log.close()
            self._log = None
