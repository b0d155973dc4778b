"""OutcomeHub unit tests with a fake clock: sequences, retention bounds, resume, takeover, drops."""

from __future__ import annotations

import pytest
from acker_protocol.wire import Outcome

from acker_service.outcome_columns import OutcomeColumns, Resolution
from acker_service.outcome_hub import OUTCOME_BYTES, OutcomeHub

INC = 0xABCDEF


def make_hub(clock, retain=100, seconds=60.0, buffer_bytes=0) -> OutcomeHub:
    """A hub with incarnation INC on the test's fake clock (no subscriber backlog beyond ``retain`` by default)."""
    return OutcomeHub(
        retain_outcomes=retain,
        retain_seconds=seconds,
        incarnation=INC,
        clock=clock,
        subscriber_buffer_bytes=buffer_bytes,
    )


def publish(hub, roots, spout="s", outcome=Outcome.ACKED, latency=0.25):
    """Publish one resolution per root for one spout."""
    hub.publish(OutcomeColumns.from_resolutions([Resolution(spout, r, outcome, latency) for r in roots]))


class Waker:
    """Counts wake-ups."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def drain(hub, sub, limit=4096):
    """All chunks available now, as (sequence, root) pairs, and the dropped total."""
    pairs, dropped = [], 0
    while (chunk := hub.take(sub, limit)) is not None:
        dropped += chunk.dropped
        pairs += [(chunk.first_sequence + i, r) for i, r in enumerate(chunk.roots.tolist())]
    return pairs, dropped


def test_sequences_start_at_one_per_spout(clock):
    """Each spout numbers its outcomes 1, 2, 3 independently of other spouts."""
    hub = make_hub(clock)
    hub.publish(
        OutcomeColumns.from_resolutions(
            [
                Resolution("a", 1, Outcome.ACKED, 0.0),
                Resolution("b", 2, Outcome.FAILED, 0.0),
                Resolution("a", 3, Outcome.TIMED_OUT, 1.5),
            ]
        )
    )
    a = hub.subscribe("a", incarnation=0, after_sequence=0, wake=Waker())
    chunk = hub.take(a)
    assert (chunk.first_sequence, chunk.roots.tolist(), chunk.outcomes.tolist()) == (1, [1, 3], [1, 3])
    assert chunk.latency_micros.tolist() == [0, 1_500_000]
    b = hub.subscribe("b", incarnation=0, after_sequence=0, wake=Waker())
    assert drain(hub, b) == ([(1, 2)], 0)


def test_first_take_answers_even_when_empty(clock):
    """A new subscription gets one empty chunk (the confirmation), then None until outcomes arrive."""
    hub = make_hub(clock)
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    chunk = hub.take(sub)
    assert (chunk.first_sequence, chunk.roots.tolist(), chunk.dropped) == (1, [], 0)
    assert hub.take(sub) is None


def test_publish_wakes_only_the_spouts_subscriber(clock):
    """Publishing wakes the subscriber of the spout it concerns, not others."""
    hub = make_hub(clock)
    wake_a, wake_b = Waker(), Waker()
    hub.subscribe("a", incarnation=0, after_sequence=0, wake=wake_a)
    hub.subscribe("b", incarnation=0, after_sequence=0, wake=wake_b)
    publish(hub, [1, 2], spout="a")
    assert (wake_a.count, wake_b.count) == (1, 0)


def test_take_respects_the_limit(clock):
    """Chunks hold at most `limit` outcomes and continue where the previous one ended."""
    hub = make_hub(clock)
    publish(hub, range(1, 11))
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    sizes = []
    while (chunk := hub.take(sub, limit=4)) is not None:
        sizes.append((chunk.first_sequence, len(chunk.roots)))
    assert sizes == [(1, 4), (5, 4), (9, 2)]


def test_count_bound_evicts_oldest_and_counts_undelivered(clock):
    """Over retain_outcomes the oldest go; the ones never delivered are dropped, once, in the next chunk."""
    hub = make_hub(clock, retain=3)
    publish(hub, range(1, 6))
    assert (hub.retained, hub.dropped_total) == (3, 2)
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    assert drain(hub, sub) == ([(3, 3), (4, 4), (5, 5)], 2)
    publish(hub, [6, 7])  # evicts 3 and 4, which were delivered: not dropped
    assert hub.dropped_total == 2
    assert drain(hub, sub) == ([(6, 6), (7, 7)], 0)


def test_slow_reader_loses_only_what_is_evicted(clock):
    """A subscriber whose backlog passes its buffer loses the oldest unread outcomes, counted as dropped."""
    hub = make_hub(clock, retain=4, buffer_bytes=4 * OUTCOME_BYTES)
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    assert drain(hub, sub) == ([], 0)
    publish(hub, range(1, 11))
    assert drain(hub, sub) == ([(7, 7), (8, 8), (9, 9), (10, 10)], 6)


def test_burst_beyond_the_count_bound_reaches_a_subscriber(clock):
    """A burst larger than retain_outcomes (a mass timeout) waits in the subscriber's buffer, nothing dropped."""
    hub = make_hub(clock, retain=4, buffer_bytes=1000 * OUTCOME_BYTES)
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    assert drain(hub, sub) == ([], 0)
    publish(hub, range(1, 1001))
    assert (hub.retained, hub.dropped_total) == (1000, 0)
    pairs, dropped = drain(hub, sub, limit=64)
    assert pairs == [(i, i) for i in range(1, 1001)] and dropped == 0
    # Delivered outcomes fall back to the count bound (kept only for a resume).
    assert hub.retained == 4 and hub.dropped_total == 0


def test_backlog_bound_is_in_bytes(clock):
    """Past subscriber_buffer_bytes of unread outcomes the oldest unread ones go, counted as dropped."""
    hub = make_hub(clock, retain=4, buffer_bytes=100 * OUTCOME_BYTES)
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    drain(hub, sub)
    publish(hub, range(1, 151))
    assert (hub.retained, hub.dropped_total) == (100, 50)
    pairs, dropped = drain(hub, sub)
    assert pairs[0] == (51, 51) and len(pairs) == 100 and dropped == 50


def test_a_spout_that_leaves_falls_back_to_the_count_bound(clock):
    """When the stream ends, its unread backlog is trimmed to retain_outcomes and the rest counted dropped."""
    hub = make_hub(clock, retain=4, buffer_bytes=1000 * OUTCOME_BYTES)
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    drain(hub, sub)
    publish(hub, range(1, 11))
    assert hub.dropped_total == 0
    hub.unsubscribe(sub)
    assert (hub.retained, hub.dropped_total) == (4, 6)
    again = hub.subscribe("s", incarnation=INC, after_sequence=0, wake=Waker())
    assert drain(hub, again) == ([(7, 7), (8, 8), (9, 9), (10, 10)], 6)


def test_age_bound_evicts_old_outcomes(clock):
    """expire() evicts outcomes older than retain_seconds and keeps younger ones."""
    hub = make_hub(clock, seconds=10.0)
    publish(hub, [1, 2])
    clock.advance(6)
    publish(hub, [3])
    clock.advance(5)  # 1 and 2 are 11 s old, 3 is 5 s old
    assert hub.expire() == 2
    assert (hub.retained, hub.dropped_total) == (1, 2)
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    assert drain(hub, sub) == ([(3, 3)], 2)


def test_resume_same_incarnation_gives_exactly_the_rest(clock):
    """Resuming at (incarnation, n) yields sequences n+1.. and nothing before."""
    hub = make_hub(clock)
    first = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    publish(hub, range(1, 6))
    assert [seq for seq, _ in drain(hub, first)[0]] == [1, 2, 3, 4, 5]
    hub.unsubscribe(first)
    publish(hub, range(6, 9))
    again = hub.subscribe("s", incarnation=INC, after_sequence=3, wake=Waker())
    assert drain(hub, again) == ([(4, 4), (5, 5), (6, 6), (7, 7), (8, 8)], 0)


def test_resume_before_retention_reports_the_gap(clock):
    """Resuming at a position older than retention reports the delivered-but-evicted outcomes as dropped."""
    hub = make_hub(clock, retain=3)
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    publish(hub, range(1, 4))
    drain(hub, sub)  # 1..3 delivered
    hub.unsubscribe(sub)
    publish(hub, range(4, 7))  # evicts 1..3 (delivered, so not counted in dropped_total)
    assert hub.dropped_total == 0
    again = hub.subscribe("s", incarnation=INC, after_sequence=1, wake=Waker())
    assert drain(hub, again) == ([(4, 4), (5, 5), (6, 6)], 2)  # 2 and 3 are gone


def test_resume_beyond_the_end_is_clamped(clock):
    """A position past the last sequence gets only outcomes published afterwards."""
    hub = make_hub(clock)
    publish(hub, [1, 2])
    sub = hub.subscribe("s", incarnation=INC, after_sequence=99, wake=Waker())
    assert drain(hub, sub) == ([], 0)
    publish(hub, [3])
    assert drain(hub, sub) == ([(3, 3)], 0)


@pytest.mark.parametrize("incarnation", [0, INC + 1])
def test_other_incarnation_starts_at_oldest(clock, incarnation):
    """A first subscribe or a position from another incarnation starts at the oldest retained outcome."""
    hub = make_hub(clock)
    publish(hub, [1, 2])
    sub = hub.subscribe("s", incarnation=incarnation, after_sequence=2, wake=Waker())
    assert drain(hub, sub) == ([(1, 1), (2, 2)], 0)


def test_takeover_supersedes_the_older_subscription(clock):
    """A second subscribe marks the first superseded, wakes it, and keeps the subscriber count at one."""
    hub = make_hub(clock)
    wake_old = Waker()
    old = hub.subscribe("s", incarnation=0, after_sequence=0, wake=wake_old)
    new = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    assert (old.superseded, new.superseded, wake_old.count, hub.subscribers) == (True, False, 1, 1)
    publish(hub, [1])
    assert hub.take(old) is None
    hub.unsubscribe(old)  # the old stream ending must not remove the new one
    assert hub.subscribers == 1
    assert drain(hub, new) == ([(1, 1)], 0)
    hub.unsubscribe(new)
    assert hub.subscribers == 0


def test_long_runs_compact_and_keep_sequences(clock):
    """Many evictions compact the log without disturbing sequence numbers or the retained count."""
    hub = make_hub(clock, retain=1000)
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=Waker())
    seen = 0
    for start in range(1, 20_001, 500):
        publish(hub, range(start, start + 500))
        pairs, dropped = drain(hub, sub)
        assert dropped == 0
        assert all(seq == root for seq, root in pairs)
        seen += len(pairs)
    assert (seen, hub.retained, hub.dropped_total) == (20_000, 1000, 0)


def test_invalid_bounds_are_refused(clock):
    """Retention needs a positive count and age."""
    with pytest.raises(ValueError):
        OutcomeHub(retain_outcomes=0, retain_seconds=1, incarnation=1, clock=clock)
    with pytest.raises(ValueError):
        OutcomeHub(retain_outcomes=1, retain_seconds=0, incarnation=1, clock=clock)


def test_a_chunk_taken_stays_as_it_was_while_the_log_grows_evicts_and_empties(clock):
    """Chunks are views of the log's columns: later publishes, evictions and regrowth never rewrite them."""
    hub = make_hub(clock, retain=10_000)
    sub = hub.subscribe("s", incarnation=INC, after_sequence=0, wake=Waker())
    hub.take(sub)  # the confirmation
    publish(hub, range(1, 1001))
    first = hub.take(sub, 500)
    publish(hub, range(5001, 9001))  # past the first arrays: the log moves into bigger ones
    chunk = hub.take(sub, 500)  # a view of the bigger arrays
    kept = chunk.roots.copy()
    drain(hub, sub)
    clock.advance(120)
    hub.expire()  # everything evicted: the log gives its arrays back
    publish(hub, range(20001, 22001))  # and starts new ones
    assert first.roots.tolist() == list(range(1, 501))
    assert chunk.roots.tolist() == kept.tolist() == list(range(501, 1001))
    assert [r for _, r in drain(hub, sub)[0]] == list(range(20001, 22001))
