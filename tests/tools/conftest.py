"""Fixtures for the tool tests (acker-ctl, acker-cluster, acker-bench, acker-demo): acker processes, Describe, Spark."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from acker_protocol import grpc_options
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from acker_service.process_cluster import ProcessCluster


@pytest.fixture(scope="module")
def metrics_cluster() -> Iterator[ProcessCluster]:
    """Three acker processes with metrics on free ports, for the read-only tests of a module."""
    with ProcessCluster(count=3, metrics_base_port=0, message_timeout=2.0) as cluster:
        yield cluster


def _describe(address: str) -> acker_pb2.DescribeResponse:
    """The Describe answer of the acker at `address`."""
    with grpc.insecure_channel(address, options=grpc_options.client_options()) as channel:
        return acker_pb2_grpc.AckerStub(channel).Describe(acker_pb2.DescribeRequest(), timeout=10)


@pytest.fixture(scope="session")
def describe_acker() -> Callable[[str], acker_pb2.DescribeResponse]:
    """The Describe answer of an acker address (test modules cannot import conftest under importlib mode)."""
    return _describe


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The run's shared local SparkSession, for acker-bench's Spark modes and acker-demo.

    Built with the settings of tests/spark/conftest.py: local_session() returns the
    session this process already has, or creates it (on an xdist worker that runs
    only this folder); stopping it at the end of the run is harmless when the Spark
    suite's fixture stops it too.
    """
    pytest.importorskip("pyspark")
    from acker_spark import LOCAL_MASTER, close_clients, local_session

    session = local_session(LOCAL_MASTER, app_name="acker-spark-tests", shuffle_partitions=4)
    session.sparkContext.parallelize(range(8), 4).map(lambda x: x).count()  # fork the Python workers once
    yield session
    session.stop()
    close_clients()
