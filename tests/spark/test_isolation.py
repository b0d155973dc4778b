"""Poison isolation as bookkeeping: suspects, halves, convictions and causes (no Spark, clock injected)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from acker_spark.driver_fed.isolation import Isolation, Verdict
from acker_spark.job_errors import JobError, job_error
from acker_spark.replay_policy import ReplayPolicy
from acker_spark.sources import Delivery

POLICY = ReplayPolicy(max_attempts=3, backoff_base=1.0, backoff_factor=2.0)
# A type the default policy retries: a convicted record is replayed alone until max_attempts.
BOOM = JobError("ConnectionResetError", "store unreachable for k3", "/app/job.py:12 in store")
POISON = JobError("ValueError", "bad record k3", "/app/job.py:12 in store")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def deliveries(n: int, attempt: int = 1) -> list[Delivery]:
    return [Delivery(f"k{i}", i, attempt) for i in range(n)]


def run_job(iso: Isolation, batch: list[Delivery], poison: str) -> list[bool | None]:
    """One job over ``batch``: it raises if ``poison`` is in it; every tree then settles (acked or failed)."""
    iso.emitted(batch)
    iso.job_started(batch)
    if any(d.key == poison for d in batch):
        iso.job_failed(batch, BOOM)
        return iso.settle([], failures(batch))
    assert iso.job_succeeded(batch) == []
    return iso.settle(batch, [])


def failures(batch: list[Delivery]) -> list[tuple[Delivery, str]]:
    return [(d, "FAILED") for d in batch]


def test_a_failed_job_is_bisected_until_the_poison_runs_alone_and_is_charged_alone() -> None:
    clock = Clock()
    iso = Isolation(POLICY, clock)
    batch = deliveries(8)
    assert run_job(iso, batch, "k3") == [Verdict.HELD] * 8  # nobody charged: all held as suspects
    jobs, verdicts = 1, {}
    while True:
        probe = iso.pop_probe(room=100)
        if not probe:
            clock.now += 60  # a convicted record waits for its backoff
            probe = iso.pop_probe(room=100)
            if not probe:
                break
        jobs += 1
        for d, v in zip(probe, run_job(iso, probe, "k3")):
            verdicts.setdefault(d.key, []).append((d.attempt, v))
    assert not iso.busy
    # Innocent records never failed again once away from k3, and kept attempt 1.
    assert all(seq == [] or all(a == 1 for a, _ in seq) for k, seq in verdicts.items() if k != "k3")
    # k3 ran alone once uncharged, then was charged per attempt until max_attempts: final.
    assert [v for _, v in verdicts["k3"]][-1] is Verdict.FINAL
    assert verdicts["k3"][-1][0] == POLICY.max_attempts
    assert iso.error_of("k3") == BOOM and iso.error_of("k2") is None
    assert jobs <= 1 + 2 * 3 + POLICY.max_attempts  # log2(8) rounds of two halves, then its own runs


def test_a_poison_convict_is_final_at_once_and_a_whitelist_decides_otherwise() -> None:
    """A ValueError convicts for good on its first run alone; with retry_on={"ValueError"} it is replayed."""
    for policy, verdict in ((POLICY, Verdict.FINAL), (replace(POLICY, retry_on={"ValueError"}), Verdict.HELD)):
        iso = Isolation(policy, Clock())
        alone = [Delivery("k3", 3, 1)]
        iso.emitted(alone)
        iso.job_started(alone)
        iso.job_failed(alone, POISON)
        assert iso.settle([], failures(alone)) == [verdict]
        assert iso.error_of("k3") == POISON


def test_suspects_already_acked_are_not_replayed_and_late_outcomes_are_not_held() -> None:
    iso = Isolation(POLICY, Clock())
    batch = deliveries(4)
    iso.emitted(batch)
    # k0 timed out before the job raised: the schedule's, charged as usual.
    assert iso.settle([], failures(batch[:1])) == [Verdict.NOT_MINE]
    iso.job_failed(batch, BOOM)
    assert iso.settle([batch[1]], failures(batch[2:])) == [Verdict.HELD, Verdict.HELD]
    assert iso.pop_probe(room=1) == [batch[2]]
    assert iso.pop_probe(room=1) == [batch[3]]
    assert iso.pop_probe(room=1) == [] and not iso.busy


def test_a_probe_waits_for_room_and_a_convict_acked_later_is_cleared() -> None:
    clock = Clock()
    iso = Isolation(POLICY, clock)
    batch = deliveries(4)
    run_job(iso, batch, "k0")
    assert iso.pop_probe(room=1) == []  # halves of 2 do not fit in 1
    first = iso.pop_probe(room=2)
    assert first == batch[:2]
    iso.emitted([first[0]])
    iso.job_started([first[0]])
    iso.job_failed([first[0]], BOOM)
    assert iso.settle([], failures([first[0]])) == [
        Verdict.HELD
    ]  # convicted, charged: replayed alone after the backoff
    assert iso.pop_probe(room=10) == batch[2:]  # the other half is due now; the convict is not
    assert iso.next_due() == clock.now + POLICY.delay(1)
    clock.now += POLICY.delay(1)
    again = iso.pop_probe(room=10)
    assert again == [first[0]._replace(attempt=2)]
    assert run_job(iso, again, "nobody") == []
    assert iso.error_of("k0") is None


def test_timeouts_while_a_job_runs_are_held_until_it_ends() -> None:
    clock = Clock()
    iso = Isolation(POLICY, clock)
    batch = deliveries(4)
    iso.emitted(batch)
    iso.job_started(batch)
    # Two trees time out while the (failing) job is still retrying its task: not charged yet.
    assert iso.settle([], [(batch[0], "TIMED_OUT"), (batch[1], "TIMED_OUT")]) == [Verdict.HELD] * 2
    assert iso.busy
    iso.job_failed(batch, BOOM)  # ... they are suspects with the others
    assert iso.settle([batch[2]], failures(batch[3:])) == [Verdict.HELD]
    assert [d.key for d in iso.pop_probe(10)] == ["k0", "k1"]
    assert [d.key for d in iso.pop_probe(10)] == ["k3"]
    # A job that returns hands its held failures back to be charged as usual.
    again = deliveries(2, attempt=1)
    iso.emitted(again)
    iso.job_started(again)
    assert iso.settle([], [(again[0], "TIMED_OUT")]) == [Verdict.HELD]
    assert iso.job_succeeded(again) == [(again[0], "TIMED_OUT")]
    assert iso.settle([again[1]], []) == [] and not iso.busy


def test_a_convict_that_timed_out_before_its_job_raised_is_final_when_out_of_attempts() -> None:
    iso = Isolation(POLICY, Clock())
    last = Delivery("k9", 9, POLICY.max_attempts)
    iso.emitted([last])
    iso.job_started([last])
    assert iso.settle([], [(last, "TIMED_OUT")]) == [Verdict.HELD]
    iso.job_failed([last], BOOM)
    assert iso.take_final() == [(last, "TIMED_OUT")] and iso.take_final() == []
    assert iso.error_of("k9") == BOOM and not iso.busy


def test_job_error_reads_the_workers_innermost_python_exception() -> None:
    text = (
        "An error occurred while calling o123.collect.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 4.0 failed 4 times\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/venv/pyspark/worker.py", line 1900, in main\n'
        "    process()\n"
        '  File "/app/job.py", line 12, in store\n'
        "    raise ValueError(f'bad record {key}')\n"
        "ValueError: bad record b.txt:2\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:600)\n"
    )
    assert job_error(RuntimeError(text)) == JobError("ValueError", "bad record b.txt:2", "/app/job.py:12 in store")
    assert str(job_error(RuntimeError(text))) == "ValueError: bad record b.txt:2 (at /app/job.py:12 in store)"


def test_job_error_of_a_driver_side_exception_names_its_own_frame() -> None:
    def job() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError) as caught:
        job()
    error = job_error(caught.value)
    assert (error.type, error.message) == ("KeyError", "'missing'")
    assert error.where.endswith(" in job") and "test_isolation.py" in error.where
    assert JobError("ClusterMisconfigured", "x").configuration and not error.configuration
