"""Fixtures for the Spark tests: ONE local SparkSession for the whole run, acker clusters per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_demo.wordcount import create_sink
from acker_spark import LOCAL_MASTER, close_clients, local_session

from ..queues.brokers import RedisServer, running_redis
from .connect_server import ConnectServer

# Short acker timeouts keep lost-tree tests quick, yet leave room for a micro-batch
# job on a busy 2-core machine (a tree must outlive the job that processes it).
MESSAGE_TIMEOUT = 4.0


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared local SparkSession ("local[2,4]": 2 cores, 4 attempts per task), warmed up."""
    session = local_session(LOCAL_MASTER, app_name="acker-spark-tests", shuffle_partitions=4)
    # Fork the Python workers once here, so no test's first job pays for it.
    session.sparkContext.parallelize(range(8), 4).map(lambda x: x).count()
    yield session
    session.stop()
    close_clients()


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers on free loopback ports."""
    with local_cluster(3, message_timeout=MESSAGE_TIMEOUT) as cluster:
        yield cluster
    close_clients()


@pytest.fixture
def patient_ackers() -> Iterator[Any]:
    """Three in-process ackers whose timeout (60 s) no job reaches: for tests that count replays exactly."""
    with local_cluster(3, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server (AOF) of this test's own."""
    with running_redis(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def client(ackers: Any) -> Iterator[ClusterClient]:
    """The driver's client for ``ackers``."""
    with ClusterClient(ackers.addresses) as cluster_client:
        yield cluster_client


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A fresh SQLite file with the word sink and dead-letter tables."""
    path = tmp_path / "sink.sqlite"
    create_sink(path)
    return path


@pytest.fixture(scope="session")
def connect_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark Connect session to a real local Connect server ("local[2,4]") started for this run, warmed up."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    server = ConnectServer(tmp_path_factory.mktemp("spark-connect") / "server.log").start()
    try:
        # The Connect builder itself, not SparkSession.builder.remote(): that one refuses to
        # connect while this process also runs the classic session of the other tests.
        session = RemoteSparkSession.builder.remote(server.url).getOrCreate()
        session.range(8).count()
        yield session
        session.stop()
    finally:
        server.stop()


@pytest.fixture
def connect_spark(connect_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The Connect session, with pyspark.sql.functions building Connect columns for the test's duration."""
    # PySpark picks Connect or classic columns (F.col, F.collect_list, DDL parsing) by
    # this variable; set only around Connect tests, the classic session is unaffected.
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    return connect_session
