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

from collections.abc import Mapping
from dataclasses import dataclass

from .job_errors import error_type

__all__ = ["BudgetExceeded", "CauseCount", "FailureBudget"]


@dataclass(frozen=True)
class CauseCount:
    """One cause of dead records: its kind (exception type, or the reason's text), how many, an example."""

    kind: str
    count: int
    example_key: str
    example_cause: str


class BudgetExceeded(RuntimeError):
    """More records failed than the run's :class:`FailureBudget` allows; ``causes`` are the top ones."""

    def __init__(self, message: str, dead: int, read: int, causes: list[CauseCount]) -> None:
        super().__init__(message)
        self.dead, self.read, self.causes = dead, read, causes


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

    def exceeded(self, dead: int, read: int) -> bool:
        """True if ``dead`` of ``read`` records is past the budget."""
        if self.records is not None and dead > self.records:
            return True
        return self.fraction is not None and read >= self.minimum and dead > self.fraction * read

    def check(self, dead: int, read: int, causes: Mapping[str, str | None], top: int = 5) -> None:
        """Raise :class:`BudgetExceeded` if past the budget; ``causes`` maps each dead record's key to its cause."""
        if not self.exceeded(dead, read):
            return
        counts = top_causes(causes, top)
        named = "; ".join(f"{c.count} x {c.kind} (e.g. {c.example_key}: {c.example_cause})" for c in counts)
        bound = " and ".join(
            part
            for part in (
                f"{self.fraction:.0%} of the records read" if self.fraction is not None else "",
                f"{self.records} records" if self.records is not None else "",
            )
            if part
        )
        raise BudgetExceeded(
            f"{dead} of {read} records read failed for good, past the failure budget ({bound}): the run stopped. "
            f"Top causes: {named or 'none recorded'}. Records not processed yet stay in the checkpoint: fix the "
            "cause and run again with it to continue (and redrive the dead letters).",
            dead,
            read,
            counts,
        )


def top_causes(causes: Mapping[str, str | None], top: int = 5) -> list[CauseCount]:
    """The ``top`` most frequent kinds of cause among ``key -> cause``, each with a count and its first example."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for key, cause in causes.items():
        kind = (error_type(cause) or cause) if cause else "no cause recorded (timed out, lost, or failed without one)"
        groups.setdefault(kind, []).append((key, cause or ""))
    ranked = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))[:top]
    return [CauseCount(kind, len(items), items[0][0], items[0][1]) for kind, items in ranked]
