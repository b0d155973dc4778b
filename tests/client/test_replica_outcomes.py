"""The spout's memory for replicated trees, on a fake clock: duplicates, missed inits, backstop pauses, resets."""

from __future__ import annotations

import numpy as np
from acker_client.pending import PendingTrees
from acker_client.replica_outcomes import ReplicaOutcomes
from acker_client.settling import Settlement
from acker_client.testing import ManualClock
from acker_protocol.wire import Outcome


def _settlement(replicas: int, clock: ManualClock, calls: list) -> Settlement:
    pending = PendingTrees(3, 10.0, replicas)
    return Settlement(
        "s", pending, clock, lambda acked, failed: calls.append((acked, failed)), ReplicaOutcomes(replicas, 10.0)
    )


def test_partner_outcome_is_a_duplicate_and_a_stray_one_is_late():
    """Root 4 (shards 1 and 2): settled by shard 2's ACKED, shard 1's TIMED_OUT is a duplicate; root 9 was never ours."""
    clock, calls = ManualClock(), []
    settlement = _settlement(2, clock, calls)
    settlement.pending.add(4, "m4", clock())
    settlement.ends(2, [4], np.array([int(Outcome.ACKED)], dtype=np.int32))  # the follower reports first
    settlement.ends(1, [4, 9], np.array([int(Outcome.TIMED_OUT)] * 2, dtype=np.int32))
    assert settlement.counts["acked"] == 1 and settlement.counts["timed_out"] == 0
    assert (settlement.counts["duplicates"], settlement.counts["late"]) == (1, 1)
    # A third outcome for root 4 is no longer expected: late.
    settlement.ends(2, [4], np.array([int(Outcome.ACKED)], dtype=np.int32))
    assert (settlement.counts["duplicates"], settlement.counts["late"]) == (1, 2)


def test_with_one_replica_every_unmatched_outcome_is_late():
    clock, calls = ManualClock(), []
    settlement = _settlement(1, clock, calls)
    settlement.pending.add(4, "m4", clock())
    settlement.ends(1, [4, 4], np.array([int(Outcome.ACKED)] * 2, dtype=np.int32))
    assert (settlement.counts["duplicates"], settlement.counts["late"]) == (0, 1)


def test_an_init_is_lost_only_when_both_replicas_missed_it():
    clock, calls = ManualClock(), []
    settlement = _settlement(2, clock, calls)
    settlement.pending.add_many(np.array([4, 5], dtype=np.uint64), ["m4", "m5"], clock())
    assert settlement.lose([4, 5]) == 0  # one replica's batch dropped
    assert settlement.lose([4]) == 1  # the other replica's too
    assert settlement.counts["lost"] == 1 and 5 in settlement.pending


def test_memory_is_forgotten_after_the_horizon():
    outcomes = ReplicaOutcomes(2, horizon=10.0)
    outcomes.settled([1, 2], 0.0)
    assert outcomes.missed_inits([3], 5.0) == []
    outcomes.prune(10.5)  # roots 1 and 2 are older than the horizon, the miss of 3 is not
    assert outcomes.duplicates([1, 2]) == 0 and len(outcomes) == 1
    outcomes.prune(16.0)
    assert len(outcomes) == 0


def test_follower_timeout_reset_restarts_the_owners_entry():
    """A TIMEOUT_RESET from the follower (shard 2 for root 4) gives the record a fresh backstop."""
    clock = ManualClock()
    pending = PendingTrees(3, 10.0, replicas=2)
    pending.add(4, "m4", clock())
    clock.advance(8.0)
    assert pending.restart_many(2, [4], clock()) == 1
    clock.advance(8.0)
    assert pending.pop_expired(clock()) == []
    clock.advance(3.0)
    assert pending.pop_expired(clock()) == ["m4"]


def test_backstop_pauses_only_while_both_replicas_streams_are_down():
    """Root 4 lives on shards 1 and 2: shard 1's outage alone neither pauses nor fires its backstop."""
    clock = ManualClock()
    pending = PendingTrees(3, 10.0, replicas=2)
    pending.add(4, "m4", clock())
    pending.set_stream_down(1, True, clock())
    assert pending.clocks[1].down_since is None  # shard 2 still reports root 4
    assert pending.clocks[0].down_since is None  # shard 0's roots: shard 0 still reports them
    pending.set_stream_down(2, True, clock())
    assert pending.clocks[1].down_since is not None  # both replicas of shard 1's roots are down
    clock.advance(5.0)
    pending.set_stream_down(2, False, clock())
    assert pending.clocks[1].down_since is None and pending.clocks[1].paused == 5.0
    clock.advance(9.5)  # 14.5 s since the add, 5 of them paused
    assert pending.pop_expired(clock()) == []
    clock.advance(1.0)
    assert pending.pop_expired(clock()) == ["m4"]


def test_a_replica_skips_its_copy_only_if_no_partner_dropped_one_since():
    """Shard 0 dropped its copy while shard 1 looked live; shard 1's batch of the same moment, failing later
    while shard 0 is READY again, must retry: skipping it would lose the operations on both replicas."""
    import time

    from acker_client.delivery import ConnectionMonitor

    monitor = ConnectionMonitor(2)
    monitor.set(0, ConnectionMonitor.READY)
    monitor.set(1, ConnectionMonitor.READY)
    buffered = time.monotonic()
    assert monitor.fall_back(0, (1,), since=buffered)  # shard 0's copy: covered by shard 1, dropped
    monitor.set(0, ConnectionMonitor.READY)  # shard 0 answers again
    assert not monitor.fall_back(1, (0,), since=buffered)  # shard 1's copy of the same operations
    monitor.set(1, ConnectionMonitor.READY)
    later = time.monotonic() + 1e-3
    assert monitor.fall_back(1, (0,), since=later)  # operations buffered after shard 0's drop: covered
