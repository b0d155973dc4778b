"""Issue 23, case 2: a shard killed with no restart makes ``run()`` raise naming it, with the real cause.

Reproduced on main: with one shard killed and nothing restarting it, the job
printed no result, raised nothing and wrote no dead letter for 480 s, only
repeated "background flush failed" warnings. Now the driver logs its
progress and the shard it waits on, and once the shard has been unreachable
longer than ``shard_down_after`` the run stops with ShardDown, naming the
shard, its address and what a connection attempt says.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from acker_client import ClusterClient, TrackedTuple
from acker_client.testing import local_cluster
from acker_spark import Bolt, GuaranteedPipeline, ReplayPolicy, ShardDown
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

RECORDS = [(f"r{i}", f"alpha beta {i}") for i in range(30)]


def store(lines: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    for line in lines:
        collector.ack(line)
    return iter(())


def test_a_dead_shard_stops_the_run_naming_it_and_the_driver_says_what_it_waits_on(
    spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with local_cluster(3, message_timeout=60.0, processes=True) as cluster:
        client = ClusterClient(cluster.addresses, wait_for_shard=0.5, deadline=1.0)
        dead = cluster.addresses[1]
        cluster.kill(1)  # and nothing restarts it
        bolt = Bolt(store, cluster.addresses, name="store", client_options={"wait_for_shard": 0.0, "deadline": 0.5})
        pipeline = GuaranteedPipeline(
            spark,
            client,
            partitions=2,
            policy=ReplayPolicy(max_attempts=5, backoff_base=0.1),
            shard_down_after=3.0,
            log_interval=0.5,
        )
        with client, caplog.at_level(logging.INFO, logger="acker_spark.pipeline"):
            with pytest.raises(ShardDown) as raised:
                pipeline.run(RECORDS, lambda rdd: bolt.apply(rdd).count())
    message = str(raised.value)
    assert f"acker shard 1 at {dead} has been unreachable for" in message
    assert "UNAVAILABLE" in message and "DEADLINE_EXCEEDED" not in message
    assert raised.value.shard.shard == 1 and raised.value.stats.emitted > 0
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress: ")]
    assert any(f"waiting on shard 1 at {dead}" in line for line in progress), progress
