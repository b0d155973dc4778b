"""The failure budget: a run stops once too many of its records are dead, naming the top causes.

A job whose every record fails (a wrong credential, a schema change) should
not grind through every attempt of every record before anyone notices.
:class:`FailureBudget` says how many dead records a run tolerates: a fraction
of the records read (``fraction``, default 5%) and/or a count (``records``),
over at least ``minimum`` records read so that the first failures of a run do
not stop it. :meth:`FailureBudget.check` raises :class:`BudgetExceeded` with the
top causes, each with its count and an example record, for the driver to stop
the run; the records not yet processed stay in the checkpoint, so fixing the
cause and running again continues the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .job_errors import error_type
from .run_report import RunError

__all__ = ["BudgetExceeded", "CauseCount", "CauseTally", "FailureBudget", "top_causes"]


@dataclass(frozen=True)
class CauseCount:
    """One cause of dead records: its kind (exception type, or the reason's text), how many, an example."""

    kind: str
    count: int
    example_key: str
    example_cause: str


class BudgetExceeded(RunError, RuntimeError):
    """More records failed than the run's :class:`FailureBudget` allows; ``causes`` are the top ones."""

    def __init__(self, message: str, dead: int, read: int, causes: list[CauseCount]) -> None:
        super().__init__(message)
        self.dead, self.read, self.causes = dead, read, causes
        # How far past the budget the run went before it stopped: records read and seconds from
        # the moment the budget was seen passed to the end of the cancelled job (0 between rounds).
        self.read_after = 0
        self.seconds_after = 0.0
        self.dead_past = 0  # deliveries failed for good beyond the budget's bound when the job had stopped


@dataclass(frozen=True)
class FailureBudget:
    """How many dead records a run tolerates: ``fraction`` of those read and/or ``records`` (None: no bound)."""

    fraction: float | None = 0.05
    records: int | None = None
    minimum: int = 100  # records read before the fraction applies

    def __post_init__(self) -> None:
        if self.fraction is not None and not 0 <= self.fraction <= 1:
            raise ValueError(f"fraction must be between 0 and 1, got {self.fraction}")
        if self.records is not None and self.records < 0:
            raise ValueError(f"records must be >= 0, got {self.records}")

    def allowed(self, read: int) -> int | None:
        """The most dead records the budget tolerates once ``read`` were read (None: no bound yet)."""
        bounds = [self.records] if self.records is not None else []
        if self.fraction is not None and read >= self.minimum:
            bounds.append(math.floor(self.fraction * read))
        return min(bounds) if bounds else None

    def exceeded(self, dead: int, read: int) -> bool:
        """True if ``dead`` of ``read`` records is past the budget."""
        if self.records is not None and dead > self.records:
            return True
        return self.fraction is not None and read >= self.minimum and dead > self.fraction * read

    def check(self, dead: int, read: int, causes: Mapping[str, str | None], top: int = 5) -> None:
        """Raise :class:`BudgetExceeded` if past the budget; ``causes`` maps each dead record's key to its cause."""
        if self.exceeded(dead, read):
            raise self.error(dead, read, top_causes(causes, top))

    def describe(self) -> str:
        """The bound in words (``5% of the records read (from 100 read)``)."""
        parts = []
        if self.fraction is not None:
            parts.append(f"{self.fraction:.0%} of the records read (from {self.minimum} read)")
        if self.records is not None:
            parts.append(f"{self.records} records")
        return " or ".join(parts) or "none"

    def error(self, dead: int, read: int, counts: list[CauseCount]) -> BudgetExceeded:
        """The error that stops a run with ``dead`` of ``read`` records failed for good, naming ``counts``."""
        named = "; ".join(f"{c.count} x {c.kind} (e.g. {c.example_key}: {c.example_cause})" for c in counts)
        return BudgetExceeded(
            f"{dead} of {read} records read failed for good, past the failure budget ({self.describe()}): the run "
            f"stopped. Top causes: {named or 'none recorded'}. Records not processed yet stay in the checkpoint: "
            "fix the cause and run again with it to continue (and redrive the dead letters).",
            dead,
            read,
            counts,
        )


NO_CAUSE = "no cause recorded (timed out, lost, or failed without one)"


class CauseTally:
    """Dead records by kind of cause (exception type, or the reason's text): a count and the first example each.

    Memory grows with the kinds, not with the records.
    """

    def __init__(self) -> None:
        self._kinds: dict[str, list[Any]] = {}  # kind -> [count, example key, example cause]

    def add(self, key: str, cause: str | None) -> None:
        """Count one dead record ``key`` that failed with ``cause``."""
        kind = (error_type(cause) or cause) if cause else NO_CAUSE
        entry = self._kinds.get(kind)
        if entry is None:
            self._kinds[kind] = [1, key, cause or ""]
        else:
            entry[0] += 1

    def __len__(self) -> int:
        return sum(entry[0] for entry in self._kinds.values())

    def top(self, count: int = 5) -> list[CauseCount]:
        """The ``count`` most frequent kinds, most frequent first (ties by name)."""
        ranked = sorted(self._kinds.items(), key=lambda item: (-item[1][0], item[0]))[:count]
        return [CauseCount(kind, n, key, cause) for kind, (n, key, cause) in ranked]


def top_causes(causes: Mapping[str, str | None], top: int = 5) -> list[CauseCount]:
    """The ``top`` most frequent kinds of cause among ``key -> cause``, each with a count and its first example."""
    tally = CauseTally()
    for key, cause in causes.items():
        tally.add(key, cause)
    return tally.top(top)
