"""ReplaySchedule: backoff-ordered replays and the pushed-back first delivery (no Spark needed)."""

from __future__ import annotations

from acker_client.testing import ManualClock
from acker_spark import Delivery, ReplayPolicy
from acker_spark.driver_fed.replays import ReplaySchedule

POLICY = ReplayPolicy(max_attempts=3, backoff_base=1.0, backoff_factor=2.0, backoff_cap=10.0)


def test_a_failed_delivery_comes_back_as_the_next_attempt_after_its_backoff():
    """A retry is queued as attempt + 1 and is not handed out before its backoff has passed."""
    clock = ManualClock()
    schedule = ReplaySchedule(POLICY, clock)
    assert schedule.retry(Delivery("k", "v", 1))
    assert schedule.pop_due() is None and schedule.waiting == 1
    clock.advance(1.0)
    assert schedule.pop_due() == Delivery("k", "v", 2)
    assert schedule.empty


def test_replays_are_due_in_backoff_order_and_attempts_run_out():
    """Longer backoffs come later; a delivery that used every attempt is refused (dead-letter it)."""
    clock = ManualClock()
    schedule = ReplaySchedule(POLICY, clock)
    schedule.retry(Delivery("second", "v", 2))  # backoff 2 s
    schedule.retry(Delivery("first", "v", 1))  # backoff 1 s
    assert not schedule.retry(Delivery("dead", "v", 3))
    assert schedule.next_due() == clock() + 1.0
    clock.advance(2.0)
    assert [schedule.pop_due().key, schedule.pop_due().key] == ["first", "second"]


def test_a_pushed_back_first_delivery_waits_behind_due_replays():
    """A first delivery the spout could not take goes out next, after any replay already due."""
    clock = ManualClock()
    schedule = ReplaySchedule(POLICY, clock)
    schedule.push_back(Delivery("new", "v", 1))
    schedule.push_back(Delivery("again", "v", 2))  # a replay that could not be emitted: due now
    assert schedule.waiting == 1 and not schedule.empty
    assert schedule.pop_due().key == "again"
    assert schedule.pop_due().key == "new"
    assert schedule.pop_due() is None and schedule.empty


def test_a_cause_the_policy_dead_letters_at_once_is_not_queued():
    """Poison causes are final with attempts left; timeouts, free text and no cause are retried; retry_on whitelists."""
    schedule = ReplaySchedule(POLICY, ManualClock())
    failed = [Delivery(k, "v", 1) for k in ("bad", "slow", "text", "none")]
    causes = ["ValueError: amount 'n/a' (at job.py:3 in parse)", "TimeoutError: pricing (at job.py:9 in call)",
              "rejected by the validator", None]  # fmt: skip
    assert schedule.retry_many(failed, causes) == [False, True, True, True]
    only = ReplaySchedule(ReplayPolicy(max_attempts=3, retry_on=["TimeoutError"]), ManualClock())
    assert only.retry_many(failed, ["KeyError: x", *causes[1:]]) == [False, True, True, True]
    assert ReplayPolicy(retry_on={"ValueError"}).retries(causes[0])
