"""SourcePipeline with executors that cannot reach the ackers: ACKS_UNDELIVERED, AcksUndelivered, ShardDown.

Through the executor-read path: the bolts report their dropped task
commits (accumulators), the trees those held end as ACKS_UNDELIVERED rather
than TIMED_OUT, are dead-lettered so, and ``run`` raises naming the shards; a
shard the driver cannot reach stops the run with ShardDown instead of a silent wait.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster, unreachable_addresses
from acker_protocol.wire import Outcome
from acker_spark import AcksUndelivered, ArrowBolt, DeadLetterStore, ReplayPolicy, ShardDown
from acker_spark.executor_read.source_pipeline import RunStopped, SourcePipeline
from acker_spark.tracking.checkpoint import Checkpoint
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

ONCE = ReplayPolicy(max_attempts=1)
# The executors' client gives up on an unreachable acker at once instead of riding out a blip.
IMPATIENT = {"wait_for_shard": 0.0, "deadline": 0.5}
RECORDS = [(f"r{i}", f"alpha beta {i}") for i in range(6)]


def _split_words(batch: Any, collector: Any) -> None:
    import pyarrow.compute as pc

    pieces = pc.split_pattern(batch.column("value"), " ")
    collector.emit({"word": pc.list_flatten(pieces)}, anchors=pc.list_parent_indices(pieces))


def _sink(batch: Any, collector: Any) -> None:
    """Acks every row on return."""


def word_job(addresses: list[str], **options: Any) -> Any:
    """split -> shuffle by word -> sink, both bolts on ``addresses``."""
    split = ArrowBolt(_split_words, addresses, schema="word string", name="split", **options)
    sink = ArrowBolt(_sink, addresses, schema=None, name="sink", **options)
    return lambda df: sink.apply_df(split.apply_df(df).repartition(2, "word")).count()


def test_bolts_on_dead_addresses_fail_the_run_as_undelivered(spark: Any, client: ClusterClient, tmp_path: Path) -> None:
    """Driver right, bolts on wrong addresses: every record ACKS_UNDELIVERED, dead-lettered so, run raises the cause."""
    wrong = unreachable_addresses(3)
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=ONCE, dead_letters=letters)
    with pytest.raises(AcksUndelivered) as raised:
        pipeline.run(RECORDS, word_job(wrong, client_options=IMPATIENT))
    error, stats = raised.value, raised.value.stats
    assert "could not deliver their acks" in str(error)
    assert any(a in str(error) for a in wrong)  # an address the executors could not reach
    assert (stats.acked, stats.acks_undelivered, stats.timed_out, stats.dead_lettered) == (0, 6, 0, 6)
    assert stats.commit_errors.get("split", 0) >= 1
    assert {d.key for d in letters.all()} == {k for k, _ in RECORDS}
    assert {d.reason for d in letters.all()} == {Outcome.ACKS_UNDELIVERED}
    # The undelivered roots are in the checkpoint: a restarted driver names those trees the same.
    assert len(Checkpoint(tmp_path / "checkpoint").read_undelivered()) == 6


def test_warn_mode_returns_the_stats_and_logs_the_cause(
    spark: Any, client: ClusterClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = unreachable_addresses(3)
    pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=ONCE, on_undelivered="warn")
    with caplog.at_level(logging.WARNING, logger="acker_spark.executor_read.source_pipeline"):
        stats = pipeline.run(RECORDS, word_job(wrong, client_options=IMPATIENT))
    assert (stats.acks_undelivered, stats.timed_out) == (6, 0) and stats.as_dict()["commit_errors"] >= 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("could not deliver their acks" in m and any(a in m for a in wrong) for m in warnings)


def test_on_undelivered_is_checked(spark: Any, client: ClusterClient, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="on_undelivered"):
        SourcePipeline(spark, client, tmp_path, on_undelivered="ignore")  # type: ignore[arg-type]


def test_bolts_in_the_wrong_shard_order_stop_the_run_at_once_then_resume(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """A misconfiguration is not replayed: the first job's failure stops the run; fixed, the checkpoint finishes it."""
    checkpoint = tmp_path / "checkpoint"
    pipeline = SourcePipeline(spark, client, checkpoint, policy=ReplayPolicy(max_attempts=4, backoff_base=0.05))
    with pytest.raises(RunStopped) as raised:
        pipeline.run(RECORDS, word_job(list(reversed(ackers.addresses))))
    error = raised.value
    assert error.cause is not None and error.cause.type == "ClusterMisconfigured"
    assert "misconfiguration" in str(error) and "shard order" in str(error) and "same checkpoint" in str(error)
    assert (error.stats.rounds, error.stats.job_errors, error.stats.replayed, error.stats.acked) == (1, 1, 0, 0)
    fixed = SourcePipeline(spark, client, checkpoint, policy=ReplayPolicy(max_attempts=4, backoff_base=0.05))
    stats = fixed.run(RECORDS, word_job(ackers.addresses))
    assert stats.resumed and (stats.emitted, stats.acked, stats.dead_lettered, stats.pending) == (6, 6, 0, 0)


def test_one_unreachable_bolt_address_delays_only_the_trees_it_owns(spark: Any, tmp_path: Path) -> None:
    """Bolts with one dead address among three: only that shard's trees fail, as ACKS_UNDELIVERED; the rest ack."""
    (dead,) = unreachable_addresses(1)
    records = [(f"r{i}", f"alpha beta {i}") for i in range(60)]
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    # A timeout the healthy trees outlive on a loaded machine: their last acks come after the split tasks rode the
    # dead shard out (20 s a flush), and at the shared ackers' 4 s 19 of 60 once timed out in the suite.
    with local_cluster(3, message_timeout=12.0) as ackers, ClusterClient(ackers.addresses) as client:
        addresses = [ackers.addresses[0], dead, ackers.addresses[2]]
        pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", policy=ONCE, dead_letters=letters)
        with pytest.raises(AcksUndelivered) as raised:
            pipeline.run(records, word_job(addresses))
    stats = raised.value.stats
    assert stats.acked > 0 and stats.timed_out == 0  # the healthy shards' trees completed
    assert stats.acked + stats.acks_undelivered == len(records) and stats.acks_undelivered > 0
    assert {d.reason for d in letters.all()} == {Outcome.ACKS_UNDELIVERED}
    assert f"shard 1 at {dead}: UNAVAILABLE" in str(raised.value) and "Connection refused" in str(raised.value)
    assert "DEADLINE_EXCEEDED" not in str(raised.value)


@pytest.mark.chaos
def test_a_dead_shard_stops_the_run_naming_it(spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A shard killed with nothing restarting it: the reading tasks cannot init, run() raises ShardDown naming it."""
    with local_cluster(3, message_timeout=60.0, processes=True) as cluster:
        client = ClusterClient(cluster.addresses, wait_for_shard=0.5, deadline=1.0)
        dead = cluster.addresses[1]
        cluster.kill(1)  # and nothing restarts it
        pipeline = SourcePipeline(
            spark,
            client,
            tmp_path / "checkpoint",
            client_options=IMPATIENT,
            # A long backoff keeps the failed records waiting while the bound passes.
            policy=ReplayPolicy(max_attempts=5, backoff_base=30.0),
            shard_down_after=3.0,
            log_interval=0.5,
        )
        job = word_job(cluster.addresses, client_options=IMPATIENT)
        with client, caplog.at_level(logging.INFO, logger="acker_spark.executor_read.source_pipeline"):
            with pytest.raises(ShardDown) as raised:
                pipeline.run([(f"r{i}", f"alpha beta {i}") for i in range(30)], job)
    message = str(raised.value)
    assert f"acker shard 1 at {dead} has been unreachable for" in message
    assert "UNAVAILABLE" in message and "DEADLINE_EXCEEDED" not in message
    # The run's own figures ride on the error: the source's 30 records copied (how many the first job read before
    # the bound passed depends on the machine's speed: none, on a loaded one).
    assert raised.value.shard.shard == 1 and raised.value.stats.copied == 30
    # The driver names the shard it waits on: between jobs in its own line, or, when the bound passes while the
    # first job still runs (a slow machine), in the job's line.
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("progress: ", "run progress: "))]
    assert any(f"waiting on shard 1 at {dead}" in line for line in progress), progress
