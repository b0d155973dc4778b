"""The README's install section, run: the wheel, a packed venv with only the client, a tracked job shipped with it.

Builds the project's wheel (once per session; ACKER_TEST_WHEEL reuses a built
one), makes a virtualenv with only that wheel and its core dependencies
(grpcio, protobuf: from PyPI or pip's cache), packs it with venv-pack as the
README says, and runs a tracked word count on a ``local-cluster`` Spark (real
executor processes, each unpacking ``spark.archives`` in its working directory)
whose executors run the venv's Python. The job reports where its executors
imported ``acker_client`` from: the archive, not this checkout.

Deselect with ``-m "not venv"`` (it needs pip's network or cache and a Rust
toolchain for the wheel).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from acker_client.testing import local_cluster

pytestmark = [pytest.mark.venv, pytest.mark.spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent(
    '''
    """The driver: the test's checkout on sys.path; the executors get only the packed venv."""
    import json, os, sys
    sys.path[:0] = json.loads(os.environ.pop("ACKER_TEST_DRIVER_PATH"))

    from acker_client import ClusterClient
    from acker_spark import Bolt, GuaranteedPipeline, ReplayPolicy
    from pyspark.sql import SparkSession

    ADDRESSES = os.environ["ACKER_ADDRESSES"].split(",")


    def split(lines, collector):
        for line in lines:
            for word in line.value.value.split():
                yield collector.emit(word, anchors=[line])
            collector.ack(line)


    def store(words, collector):
        import acker_client  # where this executor imports the client from

        for word in words:
            collector.ack(word)
        yield collector.emit(acker_client.__file__)  # unanchored: tracks nothing


    spark = SparkSession.builder.config("spark.ui.enabled", "false").getOrCreate()  # spark-submit set the rest
    split_bolt, store_bolt = Bolt(split, ADDRESSES, name="split"), Bolt(store, ADDRESSES, name="store")
    files = set()
    records = [(f"r{i}", f"alpha beta gamma {i}") for i in range(20)]
    with ClusterClient(ADDRESSES) as client:
        pipeline = GuaranteedPipeline(spark, client, partitions=2, policy=ReplayPolicy(max_attempts=1))
        job = lambda rdd: files.update(store_bolt.apply(split_bolt.apply(rdd)).map(lambda t: t.value).collect())
        stats = pipeline.run(records, job)
    spark.stop()
    print(json.dumps({"stats": stats.as_dict(), "files": sorted(files)}))
    '''
)


def _spark_home(home: Path) -> Path:
    """A Spark home of links to pyspark's, so that local-cluster workers write work/ here, not into pyspark."""
    import pyspark

    home.mkdir()
    for entry in Path(pyspark.__file__).parent.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    return home


def _clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: the commands run as in a fresh shell, not inside this checkout."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(*cmd: str | Path, cwd: Path | None = None) -> None:
    done = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=600, cwd=cwd, env=_clean_env(), check=False
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, as the README builds it: ``pip wheel --no-deps . -w dist/``."""
    given = os.environ.get("ACKER_TEST_WHEEL")
    if given:
        return Path(given)
    dist = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", REPO, "-w", dist, cwd=REPO)
    (wheel,) = dist.glob("pyspark_acker-*.whl")
    return wheel


@pytest.fixture
def ackers() -> Iterator[list[str]]:
    """Three in-process ackers the executors reach on loopback."""
    with local_cluster(3, message_timeout=30.0) as cluster:
        yield cluster.addresses


def test_a_packed_venv_ships_the_client_to_executors(project_wheel: Path, ackers: list[str], tmp_path: Path) -> None:
    env_dir, archive = tmp_path / "acker-env", tmp_path / "acker-env.tar.gz"
    # The README's commands (the venv takes the interpreter running the tests).
    base_python = getattr(sys, "_base_executable", sys.executable)
    _run(base_python, "-m", "venv", env_dir)
    _run(env_dir / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check", project_wheel, "venv-pack")
    _run(env_dir / "bin" / "venv-pack", "-p", env_dir, "-o", archive)

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = _clean_env()  # executors must not see this checkout
    spark_home = _spark_home(tmp_path / "spark-home")
    # The README's two exports and spark-submit line, as written (issue 23: without
    # PYSPARK_DRIVER_PYTHON the driver ran ./environment/bin/python and failed).
    env.update(
        PYSPARK_DRIVER_PYTHON=sys.executable,  # the driver's Python, with the package
        PYSPARK_PYTHON="./environment/bin/python",
        ACKER_ADDRESSES=",".join(ackers),
        ACKER_TEST_DRIVER_PATH=json.dumps([p for p in sys.path if p]),
        SPARK_HOME=str(spark_home),
    )
    submit = [str(spark_home / "bin" / "spark-submit"), "--master", "local-cluster[1,1,1024]"]
    submit += ["--archives", f"{archive}#environment", str(script)]
    done = subprocess.run(submit, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    (tmp_path / "driver.err").write_text(done.stderr)
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["stats"]["acked"] == 20 and result["stats"]["dead_lettered"] == 0, (result, tmp_path / "driver.err")
    assert result["files"], result
    for path in result["files"]:
        assert "/environment/lib/" in path and str(REPO) not in path, path
