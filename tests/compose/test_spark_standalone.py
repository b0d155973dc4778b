"""A tracked pipeline on a Spark standalone cluster in containers: the shape users deploy.

deploy/docker-compose.spark.yml joins the compose suite's project: a master and a
worker from the Spark image on the ackers' network. The driver runs in a
`docker-compose run spark-driver` container (tests/compose/spark_driver.py), so its
executors live in another container than the driver, and driver and executors reach
the ackers by name (acker-0:7100, ...). Source files, checkpoint and SQLite sink
are in one host folder mounted at /shared in every Spark container.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_demo.wordcount import expected_counts, sink_counts
from acker_spark import generated_sentences

from .conftest import COMPOSE_FILE, ComposeCluster, _free_port, _run, _skip_reason

SPARK_IMAGE = os.environ.get("ACKER_SPARK_IMAGE", "pyspark-acker-spark:latest")
SPARK_COMPOSE_FILE = COMPOSE_FILE.parent / "docker-compose.spark.yml"
LINES = 400


def _spark_skip_reason() -> str | None:
    reason = _skip_reason()
    if reason is None and subprocess.run(["docker", "image", "inspect", SPARK_IMAGE], capture_output=True).returncode:
        reason = f"image {SPARK_IMAGE} is missing: build it with `make images` (deploy/images/build.sh)"
    return reason


_SKIP = _spark_skip_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


class SparkServices:
    """The Spark services of deploy/docker-compose.spark.yml in the compose suite's project."""

    def __init__(self, cluster: ComposeCluster, shared: Path) -> None:
        self.cluster = cluster
        self.shared = shared
        self.ui_port = _free_port()
        self.env = {
            **cluster.env,
            "SPARK_IMAGE": SPARK_IMAGE,
            "SPARK_SHARED_DIR": str(shared),
            # The host's uid: files the containers write in the shared folder stay this user's.
            "SPARK_UID": str(os.getuid()),
            "SPARK_GID": str(os.getgid()),
            "SPARK_MASTER_UI_PORT": str(self.ui_port),
            "SPARK_WORKER_CORES": "2",
            "SPARK_WORKER_MEMORY": "1500m",
        }

    def command(self, *args: str) -> list[str]:
        """docker-compose with both files, in the ackers' project."""
        files = ("-f", str(COMPOSE_FILE), "-f", str(SPARK_COMPOSE_FILE))
        return ["docker-compose", "-p", self.cluster.project, *files, *args]

    def compose(self, *args: str, timeout: float = 180.0) -> str:
        """Run docker-compose with both files; return stdout."""
        return _run(*self.command(*args), timeout=timeout, env=self.env)

    def run_driver(self, script: str, timeout: float = 480.0) -> dict[str, Any]:
        """`run --rm spark-driver python SCRIPT /shared`; the result.json it writes (its log in the failure)."""
        done = subprocess.run(
            self.command("run", "--rm", "-T", "spark-driver", "python", script, "/shared"),
            capture_output=True, text=True, timeout=timeout, env=self.env, check=False,
        )  # fmt: skip
        result = self.shared / "result.json"
        log = "\n".join(line for line in done.stderr.splitlines() if not line.lstrip().startswith("at "))
        assert done.returncode == 0 and result.exists(), f"the driver exited {done.returncode}:\n{log[-6000:]}"
        return dict(json.loads(result.read_text()), log=log)

    def master_state(self) -> dict[str, Any]:
        """The master's status page as JSON (workers and applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
            return dict(json.load(response))

    def wait_for_workers(self, count: int, timeout: float = 120.0) -> None:
        """Until `count` workers are ALIVE at the master."""
        deadline = time.monotonic() + timeout
        alive = 0
        while time.monotonic() < deadline:
            try:
                alive = sum(w["state"] == "ALIVE" for w in self.master_state()["workers"])
            except (OSError, ValueError):
                # Not up yet: a refused connection, or (seen in CI) a master still starting
                # that answers /json/ with its HTML page.
                alive = 0
            if alive >= count:
                return
            time.sleep(0.5)
        logs = self.compose("logs", "--tail", "30", "spark-master", "spark-worker")
        raise AssertionError(f"{alive} of {count} Spark workers registered after {timeout} s:\n{logs}")

    def worker_hosts(self) -> set[str]:
        """The host names of the worker containers (what socket.gethostname() says inside them)."""
        ids = self.compose("ps", "-q", "spark-worker").split()
        return {_run("docker", "inspect", "-f", "{{.Config.Hostname}}", cid).strip() for cid in ids}


@pytest.fixture
def spark_services(compose_cluster: ComposeCluster, tmp_path: Path) -> Iterator[SparkServices]:
    """A master and one worker beside the ackers; stopped and removed after the test."""
    shared = tmp_path / "shared"
    shared.mkdir()
    services = SparkServices(compose_cluster, shared)
    try:
        services.compose("up", "-d", "--no-build", "spark-master", "spark-worker")
        services.wait_for_workers(1)
        yield services
    finally:
        services.compose("rm", "--stop", "--force", "spark-master", "spark-worker")


@pytest.mark.timeout(600)
def test_source_pipeline_with_executors_in_worker_containers(spark_services: SparkServices) -> None:
    """spark.read.text on the workers' executors, trees started and acked there: every line once, sink exact."""
    shared = spark_services.shared
    (shared / "in").mkdir()
    lines = [record.value for record in generated_sentences(LINES)]
    for index in range(2):
        (shared / "in" / f"part-{index}.txt").write_text("".join(f"{line}\n" for line in lines[index::2]))
    shutil.copy(Path(__file__).with_name("spark_driver.py"), shared / "spark_driver.py")

    started = time.monotonic()
    result = spark_services.run_driver("/shared/spark_driver.py")
    wall = time.monotonic() - started
    stats = result["stats"]
    print(f"standalone cluster: {wall:.1f} s for the driver container, {result['seconds']:.1f} s in the driver;"
          f" stats {stats}")  # fmt: skip

    # Replays are allowed (a tree can outlive the suite's 4 s message timeout on a busy machine), losses not.
    counts = (stats["emitted"], stats["acked"], stats["dead_lettered"], stats["pending"])
    assert counts == (LINES, LINES, 0, 0), f"{stats}\n{result['log'][-6000:]}"
    assert sink_counts(shared / "sink.sqlite") == expected_counts([(str(i), line) for i, line in enumerate(lines)])
    # Where the bolts ran: Python workers in the worker container, none in the driver's.
    workers = spark_services.worker_hosts()
    ran_on = {name.rsplit("-", 1)[0] for name in os.listdir(shared / "hosts")}
    assert ran_on and ran_on <= workers, (ran_on, workers)
    assert result["driver_host"] not in ran_on | workers
    # Spark's view: block managers of the driver and of at least one executor elsewhere.
    assert [bm for bm in result["block_managers"] if not bm.startswith(result["driver_address"] + ":")], result
