"""Bolt re-runs against real ackers, without Spark: held acks, deterministic ids and dedup keys."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from acker_client import ClusterClient, Spout, TrackedTuple
from acker_demo.wordcount import split_words
from acker_protocol.wire import Outcome
from acker_spark import Bolt, Delivery


class Outcomes:
    """Spout callbacks recorded per message id."""

    def __init__(self) -> None:
        self.by_id: dict[Any, list[Outcome]] = {}
        self._lock = threading.Lock()

    def ack(self, message_id: Any) -> None:
        with self._lock:
            self.by_id.setdefault(message_id, []).append(Outcome.ACKED)

    def fail(self, message_id: Any, reason: Any) -> None:
        with self._lock:
            self.by_id.setdefault(message_id, []).append(reason)


def emit_sentences(spout: Spout, count: int) -> list[TrackedTuple]:
    """Start ``count`` trees of three-word sentences."""
    return [spout.emit(Delivery(f"s{i}", f"alpha beta gamma{i}", 1), f"s{i}") for i in range(count)]


def shipped(tuples: list[TrackedTuple]) -> list[TrackedTuple]:
    """Copies as another task would receive them (pickled: no per-process bookkeeping)."""
    return pickle.loads(pickle.dumps(tuples))


def ack_all(tuples: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    """A leaf bolt: ack every input."""
    for t in tuples:
        collector.ack(t)
    return iter(())


class NoDedupBolt(Bolt):
    """A bolt that commits without its dedup key: what plain XOR acking would do."""

    def _commit(self, collector: Any, partition: int) -> None:
        collector.commit(0)


def run_twice_then_ack(bolt: Bolt, ackers: Any, client: ClusterClient, count: int = 20) -> Outcomes:
    """Run ``bolt`` over a partition twice (the second time reversed), ack the second run's children."""
    outcomes = Outcomes()
    with Spout(client, on_ack=outcomes.ack, on_fail=outcomes.fail) as spout:
        sentences = emit_sentences(spout, count)
        first = list(bolt.run_partition(0, shipped(sentences)))
        second = list(bolt.run_partition(0, shipped(sentences)[::-1]))
        assert sorted(tuple(t.message_id.items()) for t in first) == sorted(tuple(t.message_id.items()) for t in second)
        list(Bolt(ack_all, ackers.addresses).run_partition(0, second))
        assert spout.wait_idle(20.0)
    return outcomes


def test_rerun_of_a_partition_acks_every_tree_once(ackers: Any, client: ClusterClient) -> None:
    """A partition processed twice (any order) yields the same child ids; the repeat ack is deduplicated."""
    outcomes = run_twice_then_ack(Bolt(split_words, ackers.addresses), ackers, client)
    assert outcomes.by_id == {f"s{i}": [Outcome.ACKED] for i in range(20)}
    assert sum(server.ledger.stats.deduplicated for server in ackers.servers) == 20


def test_without_dedup_keys_a_rerun_hangs_trees(ackers: Any, client: ClusterClient) -> None:
    """Control: the same re-run with plain XOR acks cancels the first ack and the trees time out."""
    outcomes = run_twice_then_ack(NoDedupBolt(split_words, ackers.addresses), ackers, client, count=5)
    assert outcomes.by_id == {f"s{i}": [Outcome.TIMED_OUT] for i in range(5)}


def test_failed_attempt_sends_nothing(ackers: Any, client: ClusterClient) -> None:
    """An attempt that raises mid-partition changes no ledger: the retry alone completes every tree."""
    crash = {"armed": True}

    def crash_once(tuples: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
        for n, t in enumerate(split_words(tuples, collector)):
            if crash["armed"] and n == 7:
                crash["armed"] = False
                raise RuntimeError("attempt 0 dies")
            yield t

    bolt = Bolt(crash_once, ackers.addresses)
    outcomes = Outcomes()
    with Spout(client, on_ack=outcomes.ack, on_fail=outcomes.fail) as spout:
        sentences = emit_sentences(spout, 6)
        with pytest.raises(RuntimeError, match="attempt 0 dies"):
            list(bolt.run_partition(3, shipped(sentences)))
        children = list(bolt.run_partition(3, shipped(sentences)))
        list(Bolt(ack_all, ackers.addresses).run_partition(0, children))
        assert spout.wait_idle(20.0)
    assert outcomes.by_id == {f"s{i}": [Outcome.ACKED] for i in range(6)}
    assert sum(server.ledger.stats.deduplicated for server in ackers.servers) == 0


def test_consumer_stopping_early_discards(ackers: Any, client: ClusterClient) -> None:
    """A partly consumed partition (a cancelled task) sends nothing; the full run completes the trees."""
    bolt = Bolt(split_words, ackers.addresses)
    outcomes = Outcomes()
    with Spout(client, on_ack=outcomes.ack, on_fail=outcomes.fail) as spout:
        sentences = emit_sentences(spout, 4)
        partial = bolt.run_partition(0, shipped(sentences))
        next(partial)
        partial.close()
        children = list(bolt.run_partition(0, shipped(sentences)))
        list(Bolt(ack_all, ackers.addresses).run_partition(0, children))
        assert spout.wait_idle(20.0)
    assert outcomes.by_id == {f"s{i}": [Outcome.ACKED] for i in range(4)}


def test_untracked_bolt_runs_the_same_function() -> None:
    """addresses=None runs the function with a no-op collector and untracked outputs."""
    bolt = Bolt(split_words, None)
    out = list(bolt.run_partition(0, [TrackedTuple(Delivery("k", "a b", 1))]))
    assert [t.value.word for t in out] == ["a", "b"] and not any(t.anchored for t in out)


def test_bolt_outside_spark_needs_an_index() -> None:
    """Calling the bolt as a mapPartitions function outside a task says what to use instead."""
    with pytest.raises(RuntimeError, match="run_partition"):
        list(Bolt(split_words, None)(iter(())))
