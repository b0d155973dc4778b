"""Fixtures for the queue tests: a redis-server per test, one rabbitmq-server node per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .brokers import RabbitServer, RedisServer, running_rabbitmq, running_redis


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (AOF in its temp dir), stopped after it."""
    with running_redis(tmp_path / "redis") as server:
        yield server


@pytest.fixture(scope="session")
def rabbitmq_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitServer]:
    """One rabbitmq-server node for the session (it takes seconds to start); tests use queues of their own."""
    with running_rabbitmq(tmp_path_factory.mktemp("rabbitmq")) as server:
        yield server
