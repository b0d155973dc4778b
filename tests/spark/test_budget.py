"""The failure budget's arithmetic and its report (no Spark needed)."""

from __future__ import annotations

import pytest
from acker_spark.budget import BudgetExceeded, FailureBudget, top_causes


def test_fraction_applies_after_the_minimum_and_a_count_at_once() -> None:
    """5% of what was read, once 100 records were read; a count bound regardless of how many were read."""
    budget = FailureBudget()
    assert not budget.exceeded(dead=10, read=50)  # too early to judge a fraction
    assert not budget.exceeded(dead=5, read=100) and budget.exceeded(dead=6, read=100)
    assert FailureBudget(fraction=None, records=3).exceeded(dead=4, read=4)
    assert not FailureBudget(fraction=None, records=None).exceeded(dead=10**6, read=10**6)
    with pytest.raises(ValueError, match="fraction"):
        FailureBudget(fraction=1.5)


def test_the_error_names_the_top_causes_with_counts_and_an_example() -> None:
    """The report ranks the kinds of cause and shows one record of each."""
    causes = {f"k{i}": f"ValueError: bad row {i} (at job.py:3 in parse)" for i in range(30)}
    causes.update({f"t{i}": "TimeoutError: service (at job.py:9 in call)" for i in range(5)})
    causes["x"] = None
    with pytest.raises(BudgetExceeded) as raised:
        FailureBudget().check(dead=36, read=200, causes=causes)
    error = raised.value
    assert (error.dead, error.read) == (36, 200)
    assert [(c.kind, c.count) for c in error.causes] == [("ValueError", 30), ("TimeoutError", 5), (
        "no cause recorded (timed out, lost, or failed without one)", 1)]  # fmt: skip
    assert "30 x ValueError (e.g. k0: ValueError: bad row 0" in str(error)
    assert "fix the cause and run again" in str(error)
    assert top_causes(causes, top=1)[0].kind == "ValueError"
