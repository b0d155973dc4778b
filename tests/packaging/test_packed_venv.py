"""The install commands of docs/deployment.md, run: the wheel, a packed venv with only the client, a tracked job shipped with it.

Builds the project's wheel (once per session; ACKER_TEST_WHEEL reuses a built
one), makes a virtualenv with only that wheel and its core dependencies
(grpcio, protobuf, and pyarrow and pandas for the executors' mapInArrow: from
PyPI or pip's cache), packs it with venv-pack as the
docs/deployment.md says, and runs a tracked word count on a ``local-cluster`` Spark (real
executor processes, each unpacking ``spark.archives`` in its working directory)
whose executors run the venv's Python. The job reports where its executors
imported ``acker_client`` from: the archive, not this checkout.

Deselect with ``-m "not venv"`` (it needs pip's network or cache and a Rust
toolchain for the wheel).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from acker_client.testing import local_cluster

from .conftest import clean_env, run_checked

pytestmark = [pytest.mark.venv, pytest.mark.spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent(
    '''
    """The driver: the test's checkout on sys.path; the executors get only the packed venv."""
    import json, os, sys, tempfile
    sys.path[:0] = json.loads(os.environ.pop("ACKER_TEST_DRIVER_PATH"))

    from acker_client import ClusterClient
    from acker_spark import Bolt, ReplayPolicy, SourcePipeline, tracked_rdd
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
    with ClusterClient(ADDRESSES) as client, tempfile.TemporaryDirectory() as work:
        pipeline = SourcePipeline(spark, client, f"{work}/checkpoint", policy=ReplayPolicy(max_attempts=1), progress=None)
        bolts = lambda df: store_bolt.apply(split_bolt.apply(tracked_rdd(df)))
        job = lambda df: files.update(bolts(df).map(lambda t: t.value).collect())
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


@pytest.fixture
def ackers() -> Iterator[list[str]]:
    """Three in-process ackers the executors reach on loopback."""
    with local_cluster(3, message_timeout=30.0) as cluster:
        yield cluster.addresses


def test_a_packed_venv_ships_the_client_to_executors(project_wheel: Path, ackers: list[str], tmp_path: Path) -> None:
    env_dir, archive = tmp_path / "acker-env", tmp_path / "acker-env.tar.gz"
    # docs/deployment.md's commands (the venv takes the interpreter running the tests).
    base_python = getattr(sys, "_base_executable", sys.executable)
    run_checked(base_python, "-m", "venv", env_dir)
    # pyarrow and pandas: the pipeline reads its records on the executors with mapInArrow.
    pip = [env_dir / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check", project_wheel]
    run_checked(*pip, "pyarrow>=18", "pandas>=2.2,<3", "venv-pack")
    run_checked(env_dir / "bin" / "venv-pack", "-p", env_dir, "-o", archive)

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = clean_env()  # executors must not see this checkout
    spark_home = _spark_home(tmp_path / "spark-home")
    # docs/deployment.md's two exports and spark-submit line, as written (issue 23: without
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
