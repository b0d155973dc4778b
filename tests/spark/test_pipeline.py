"""The tracked pipeline on local Spark: shuffles, task retries, recomputation, failures, a killed acker."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_demo.wordcount import (
    CountWords,
    FailureInjection,
    build_job,
    expected_counts,
    sink_counts,
    split_words,
    stable_partition,
    word_of,
)
from acker_protocol.wire import Outcome
from acker_spark import (
    Bolt,
    DeadLetterStore,
    GuaranteedPipeline,
    Job,
    ReplayPolicy,
    generated_sentences,
)
from acker_spark.sqlite import open_db
from pyspark import cloudpickle

from .audit import AckAudit
from .conftest import MESSAGE_TIMEOUT

# Spark's workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

FAST = ReplayPolicy(max_attempts=4, backoff_base=0.05, backoff_factor=2.0, backoff_cap=0.5)


def run(
    spark: Any,
    client: ClusterClient,
    db: Path,
    records: list[Any],
    job: Job,
    *,
    policy: ReplayPolicy = FAST,
    max_pending: int = 100,
) -> tuple[Any, AckAudit]:
    """Run ``job`` over ``records`` through a GuaranteedPipeline; return its stats and audit."""
    audit = AckAudit(db, records)
    pipeline = GuaranteedPipeline(
        spark,
        client,
        max_pending=max_pending,
        partitions=4,
        policy=policy,
        dead_letters=DeadLetterStore(db),
        on_outcome=audit,
    )
    return pipeline.run(records, job), audit


def task_attempts(db: Path) -> Counter[int]:
    """How many task runs each attempt number had, from the audit table the tests' bolts fill."""
    with open_db(db) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS task_runs (stage TEXT, partition INT, attempt INT)")
        return Counter(a for (a,) in conn.execute("SELECT attempt FROM task_runs"))


def audited(fn: Callable[..., Any], db: Path, stage: str, crash_partition: int | None = None) -> Callable[..., Any]:
    """Wrap a bolt function: log each task run, and crash attempt 0 of one partition after its first tuple."""

    def wrapper(tuples: Any, collector: Any) -> Any:
        from pyspark import TaskContext

        context = TaskContext.get()
        with open_db(db) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS task_runs (stage TEXT, partition INT, attempt INT)")
            conn.execute(
                "INSERT INTO task_runs VALUES (?, ?, ?)",
                (stage, context.partitionId(), context.attemptNumber()),
            )
        crash = context.partitionId() == crash_partition and context.attemptNumber() == 0
        for n, out in enumerate(fn(tuples, collector)):
            if crash and n == 1:
                raise RuntimeError("injected: first attempt dies mid-partition")
            yield out
        if crash:
            raise RuntimeError("injected: first attempt dies at the end of its partition")

    return wrapper


def assert_every_record_acked_once(stats: Any, audit: AckAudit, records: list[Any], db: Path) -> None:
    assert audit.outcomes == {key: [Outcome.ACKED] for key, _ in records}
    assert audit.false_acks == []
    assert (stats.emitted, stats.acked, stats.replayed, stats.dead_lettered) == (
        len(records),
        len(records),
        0,
        0,
    )
    assert (stats.failed, stats.timed_out, stats.lost, stats.job_errors) == (0, 0, 0, 0)
    assert sink_counts(db) == expected_counts(records)


def test_multi_stage_shuffle_acks_every_record_once(spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """Sentences -> words -> shuffle by word -> sink: every record ACKED exactly once, sink exact."""
    records = list(generated_sentences(300, seed=1))
    job, _ = build_job(ackers.addresses, db, partitions=3)
    stats, audit = run(spark, client, db, records, job)
    assert_every_record_acked_once(stats, audit, records, db)
    assert stats.batches == 3


def test_task_retries_cause_no_false_ack_and_no_timeout(
    spark: Any, ackers: Any, client: ClusterClient, db: Path
) -> None:
    """Attempt 0 of a task per stage raises mid-partition; Spark retries; every record acks on delivery 1."""
    records = list(generated_sentences(200, seed=2))
    split = Bolt(audited(split_words, db, "split", crash_partition=1), ackers.addresses, name="split")
    count = Bolt(audited(CountWords(db), db, "count", crash_partition=2), ackers.addresses, name="count")

    def job(rdd: Any) -> None:
        words = split.apply(rdd).keyBy(word_of).partitionBy(4, stable_partition).values()
        count.apply(words).count()

    stats, audit = run(spark, client, db, records, job, max_pending=200)
    assert task_attempts(db)[1] == 2  # both injected crashes were retried by Spark
    assert_every_record_acked_once(stats, audit, records, db)


def test_recomputed_stage_is_deduplicated(spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """An un-cached stage run by two actions re-sends its acks; the acker drops the repeat, no tree hangs."""
    records = list(generated_sentences(200, seed=3))
    split = Bolt(audited(split_words, db, "split"), ackers.addresses, name="split")
    count = Bolt(CountWords(db), ackers.addresses, name="count")

    def job(rdd: Any) -> None:
        words = split.apply(rdd)
        words.count()  # first computation of the split stage: its acks are committed here
        by_word = words.keyBy(word_of).partitionBy(4, stable_partition).values()  # ... and recomputed here
        count.apply(by_word).count()

    stats, audit = run(spark, client, db, records, job, max_pending=200)
    runs = task_attempts(db)
    assert runs[0] == 2 * 4  # 4 split partitions, each computed twice
    assert sum(s.ledger.stats.deduplicated for s in ackers.servers) == len(records)
    assert_every_record_acked_once(stats, audit, records, db)


def test_per_record_failures_replay_exactly_those_and_dead_letter(
    spark: Any, ackers: Any, client: ClusterClient, db: Path
) -> None:
    """Records failing once are replayed and acked; records failing always end in the dead-letter table."""
    records = list(generated_sentences(120, seed=4))
    keys = [key for key, _ in records]
    always, once = frozenset(keys[5:8]), frozenset(keys[40:50])
    job, _ = build_job(ackers.addresses, db, injection=FailureInjection(always_fail=always, fail_first=once))
    policy = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2)
    stats, audit = run(spark, client, db, records, job, policy=policy)
    assert stats.replayed_keys == always | once
    assert set(audit.first_failures()) == always | once
    assert all(audit.outcomes[k] == [Outcome.FAILED, Outcome.ACKED] for k in once)
    assert all(audit.outcomes[k] == [Outcome.FAILED] * 3 for k in always)
    dead = DeadLetterStore(db).all()
    assert {d.key: (d.reason, d.attempts) for d in dead} == {k: (Outcome.FAILED, 3) for k in always}
    assert (stats.acked, stats.dead_lettered, stats.replayed) == (
        len(records) - 3,
        3,
        len(once) + 2 * len(always),
    )
    assert audit.false_acks == []
    assert sink_counts(db) == expected_counts(records, always)


@pytest.mark.chaos
def test_killed_acker_loses_no_record(spark: Any, db: Path) -> None:
    """Acker shard 1 is SIGKILLed during the first job and restarted: its records are replayed, none lost."""
    records = list(generated_sentences(240, seed=5))
    with (
        local_cluster(3, message_timeout=MESSAGE_TIMEOUT, processes=True) as cluster,
        ClusterClient(cluster.addresses) as client,
    ):
        inner, _ = build_job(cluster.addresses, db, partitions=4)
        jobs = {"n": 0}

        def job(rdd: Any) -> None:
            jobs["n"] += 1
            if jobs["n"] == 1:
                cluster.kill(1)
                try:
                    inner(rdd)
                finally:
                    cluster.restart(1)
            else:
                inner(rdd)

        stats, audit = run(spark, client, db, records, job, max_pending=120)
    failures = audit.first_failures()
    # A task that finds shard 1 refusing connections withholds its acks and reports them at once,
    # so its trees may end ACKS_UNDELIVERED (reported before their timeout) rather than TIMED_OUT.
    assert failures and set(failures.values()) <= {Outcome.LOST, Outcome.TIMED_OUT, Outcome.ACKS_UNDELIVERED}
    assert stats.replayed_keys == set(failures)
    assert all(seq[-1] is Outcome.ACKED for seq in audit.outcomes.values())
    assert (stats.acked, stats.dead_lettered) == (len(records), 0)
    assert stats.lost + stats.timed_out + stats.acks_undelivered == stats.replayed
    assert audit.false_acks == []
    assert sink_counts(db) == expected_counts(records)
