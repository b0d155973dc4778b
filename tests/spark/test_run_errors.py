"""One error family: everything that ends a run is a RunError carrying the run's stats, and keeps its old base."""

from __future__ import annotations

import pytest
from acker_client import AckerError
from acker_spark import RunError, RunStats
from acker_spark.budget import BudgetExceeded
from acker_spark.executor_read.job_check import JobWritesItself, OutputForgotten, OutputNotReturned
from acker_spark.executor_read.memory_source import DuplicateIdentity
from acker_spark.redrive import RedriveRefused, RedriveUnfinished
from acker_spark.run_report import AcksUndelivered, RecordsFailed, RunStopped, ShardDown, fills_run_stats
from acker_spark.tracking.checkpoint import WrongCheckpoint
from acker_spark.tracking.identity import UnstableIdentity

FAMILY = [
    (AcksUndelivered, AckerError),
    (RecordsFailed, AckerError),
    (ShardDown, AckerError),
    (RunStopped, RuntimeError),
    (BudgetExceeded, RuntimeError),
    (RedriveUnfinished, RuntimeError),
    (OutputForgotten, TypeError),
    (OutputNotReturned, TypeError),
    (JobWritesItself, TypeError),
    (RedriveRefused, TypeError),
    (UnstableIdentity, ValueError),
    (DuplicateIdentity, ValueError),
    (WrongCheckpoint, ValueError),
]


@pytest.mark.parametrize(("error", "old_base"), FAMILY, ids=[e.__name__ for e, _ in FAMILY])
def test_every_run_ending_error_is_a_run_error_and_keeps_its_old_base(error: type, old_base: type) -> None:
    """``except RunError`` catches each; ``except TypeError`` (or the base it had) still does too."""
    assert issubclass(error, RunError) and issubclass(error, old_base)


@pytest.mark.parametrize(("error", "old_base"), FAMILY, ids=[e.__name__ for e, _ in FAMILY])
def test_every_run_ending_error_is_importable_from_the_package(error: type, old_base: type) -> None:
    """``from acker_spark import OutputForgotten`` works for each, as docs/spark.md names them."""
    import acker_spark

    assert getattr(acker_spark, error.__name__) is error and error.__name__ in acker_spark.__all__


class _Driver:
    """A stand-in driver: its run raises what it is told to."""

    def __init__(self, error: BaseException) -> None:
        self.stats = RunStats(emitted=7)
        self.error = error

    @fills_run_stats
    def run(self) -> RunStats:
        raise self.error


def test_a_run_error_leaving_run_carries_the_drivers_stats() -> None:
    driver = _Driver(OutputForgotten("the job returned a DataFrame and there is no output="))
    with pytest.raises(RunError) as raised:
        driver.run()
    assert raised.value.stats is driver.stats and raised.value.stats.emitted == 7


def test_stats_an_error_already_carries_are_kept_and_other_errors_pass_untouched() -> None:
    own = RunStats(emitted=3)
    stopped = RunStopped("stopped", None, own)
    with pytest.raises(RunStopped) as raised:
        _Driver(stopped).run()
    assert raised.value.stats is own
    with pytest.raises(KeyError):
        _Driver(KeyError("not a run error")).run()
