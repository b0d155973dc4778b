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
