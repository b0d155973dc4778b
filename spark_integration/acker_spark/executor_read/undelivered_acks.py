"""A SourcePipeline run's acks that bolts could not deliver: collected after each job, raised once all settled.

A bolt whose task cannot reach a shard drops its acks and reports the task
commit (roots and causes) through Spark accumulators, counted from the bolt's
creation. :class:`UndeliveredAcks` takes the run's share of those reports
after each job: the roots are journaled in the book (their timeouts end as
``ACKS_UNDELIVERED``), the causes kept in the checkpoint's manifest (a
resumed run still names them), and the driver's log says so at once (the
executors' warnings may be on other machines). Once every record is settled,
:meth:`UndeliveredAcks.check` raises :class:`~acker_spark.run_report.AcksUndelivered`
(or warns) if a record was dead-lettered because of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import numpy as np

from ..run_report import AcksUndelivered, SourceStats
from ..steps.step import CommitBaseline, CommitErrors
from ..tracking.book import ReplayBook
from ..tracking.checkpoint import SourceSection

__all__ = ["UndeliveredAcks"]


class UndeliveredAcks:
    """The bolts' dropped task commits during one run (see the module).

    ``save`` writes the run's manifest; ``logger`` is the driver's (its users
    look for these lines there).
    """

    def __init__(self, save: Callable[[], None], logger: logging.Logger) -> None:
        self.save = save
        self.log = logger
        # The bolts' reports when the run started (they count from their creation) and this run's reports.
        self._baseline = CommitBaseline()
        self.errors: dict[str, CommitErrors] = {}

    def start(self) -> None:
        """The run starts: what the bolts reported before is not this run's."""
        self._baseline.start()

    def collect(self, book: ReplayBook, run: SourceSection, stats: SourceStats) -> None:
        """After a job: the bolts' dropped task commits (Spark accumulators), their roots journaled, reasons fixed."""
        fresh = self._baseline.since()  # this run's share only: a bolt may have run before
        if not fresh:
            return
        first = not self.errors
        self.errors = fresh
        stats.commit_errors = {name: r.errors for name, r in fresh.items()}
        roots = frozenset().union(*(r.roots for r in fresh.values()))
        book.add_undelivered(np.fromiter(roots, dtype=np.uint64, count=len(roots)))
        causes = sorted({c for r in fresh.values() for c in r.causes} | set(run.commit_causes))
        if causes != run.commit_causes:
            run.commit_causes = causes[:16]
            self.save()
        if first:
            # The driver's log, at once: the executors' warnings may be on other machines.
            self.log.warning(
                "executors could not deliver acks of bolts %s: %s; the affected records will fail as ACKS_UNDELIVERED",
                ", ".join(sorted(fresh)),
                "; ".join(causes),
            )

    def check(
        self, book: ReplayBook, run: SourceSection, stats: SourceStats, on_undelivered: Literal["raise", "warn"]
    ) -> None:
        """Raise (or warn) if a record was dead-lettered because its acks could not be delivered.

        Deliveries that failed so but were acked on a replay (a short outage)
        are in the stats and the log only: the run did its work.
        """
        if not stats.acks_undelivered:
            return
        errors = dict(self.errors)
        recorded = tuple(run.commit_causes)
        if recorded and not any(r.causes for r in errors.values()):  # a resumed run: the first driver's causes
            errors["earlier drivers"] = CommitErrors("earlier drivers", 0, frozenset(), recorded)
        error = AcksUndelivered(stats, errors)
        if on_undelivered == "raise" and book.dead_for_undelivered():
            raise error
        self.log.warning("%s", error)
