"""acker-bench --mode queue: the verdict finds each kind of error; a scaled-down fault run against real brokers is exact."""

from __future__ import annotations

from collections import Counter

import pytest
from acker_bench.queue_bench import QueueBenchConfig, _verdict, is_poison, payload, run_queue_bench

IDS = [f"m{i:07d}" for i in range(60)]
DRAIN = {"faults_injected": [], "driver_starts": 1, "driver_restarts_after_error": 0, "drain_seconds": 1.0}


def exact_rows(dead: set[str]) -> Counter[tuple[str, str]]:
    return Counter((m, w) for i, m in enumerate(IDS) if m not in dead for w in payload(i).split(" "))


def verdict(rows: Counter[tuple[str, str]], dead: list[str], held: int = 0) -> dict:
    state = {"held": held, "waiting": 0, "dead": dead}
    return _verdict(QueueBenchConfig(messages=60), IDS, state, rows, DRAIN, 10.0, 0.0)


def test_an_exact_drain_is_ok() -> None:
    """Every message's rows once, the poison one dead-lettered: ok."""
    result = verdict(exact_rows({IDS[5]}), [IDS[5]])
    assert (result["acked_at_broker"], result["dead_lettered"], result["ok"]) == (59, 1, True)
    assert (result["duplicates"], result["missing"], result["unexpected"]) == (0, 0, 0)


def test_duplicates_missing_unexpected_and_held_messages_are_not_ok() -> None:
    """A row twice, a row lost, a dead message's row in the output, a message still held: each is counted."""
    rows = exact_rows({IDS[5]})
    rows[(IDS[1], "w1_0")] += 1
    del rows[(IDS[2], "w2_0")]
    rows[(IDS[5], "w5_0")] += 1
    result = verdict(rows, [IDS[5]], held=1)
    assert (result["duplicates"], result["missing"], result["unexpected"]) == (1, 1, 1)
    assert result["acked_at_broker"] == 58 and not result["ok"]
    assert not verdict(exact_rows(set()), [])["ok"]  # the poison message was not dead-lettered


def test_the_drain_is_one_batch_without_faults_and_one_more_than_the_faults_with_them() -> None:
    """A throughput run drains the queue in one run (as a nightly drain does); a fault run leaves room for each fault."""
    assert QueueBenchConfig(messages=20_000).batch == 20_000
    assert QueueBenchConfig(broker="rabbitmq", messages=200_000).batch == 50_000  # the channel's prefetch bound
    assert QueueBenchConfig(messages=20, faults=("broker", "acker")).batch == 7
    assert [i for i in range(300) if is_poison(i)] == [5, 105, 205]  # a run of 20 messages has one


def test_bad_options_are_refused() -> None:
    """An unknown broker or fault is a mistake, named."""
    with pytest.raises(ValueError, match="--broker"):
        QueueBenchConfig(broker="kafka")
    with pytest.raises(ValueError, match="unknown --faults"):
        QueueBenchConfig(faults=("executor",))


# The two fault cases share the three faults: both brokers restart (the sources reconnect by themselves,
# the driver keeps running); Redis also takes the acker kill, RabbitMQ the driver's SIGKILL (its channel
# closes, the broker requeues the open batch, the ledger of settled ids recognises the redeliveries). Few messages, few batches,
# a short message timeout and three attempts keep each to a few Spark runs: well under a minute on a quiet
# 2-core machine. The full-size run is the command (acker-bench --mode queue ... --faults broker,driver,acker).
FAULT_CASES = {"redis": ("broker", "acker"), "rabbitmq": ("broker", "driver")}


@pytest.mark.chaos
@pytest.mark.spark
@pytest.mark.timeout(600)  # a few Spark runs; minutes only on a machine loaded many times over
@pytest.mark.parametrize("broker", sorted(FAULT_CASES))
def test_fault_run_every_message_acked_once_or_dead_lettered(broker: str) -> None:
    """Faults at the broker and around it: each message once in the output, or dead-lettered with its cause."""
    faults = FAULT_CASES[broker]
    config = QueueBenchConfig(
        broker=broker, messages=20, faults=faults, message_timeout=5.0, max_attempts=3, compare_files=False, timeout=500
    )
    result = run_queue_bench(config)
    assert result["faults_injected"] == list(faults), result
    assert (result["duplicates"], result["missing"], result["unexpected"], result["still_at_broker"]) == (0, 0, 0, 0)
    assert result["acked_at_broker"] + result["dead_lettered"] == 20 and result["poison_dead_lettered"] == 1
    assert result["ok"], result
