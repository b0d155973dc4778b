"""A driver's Spark jobs under one cancellable name: a job group on classic Spark, a tag on Spark Connect.

A round's job runs synchronously in the driver thread; another thread (the
round watch) must be able to stop it when the run should stop, e.g. once the
failure budget is passed. Classic Spark cancels a job group
(``setJobGroup(..., interruptOnCancel=True)``, ``cancelJobGroup``: the tasks
are killed, their Python workers with them); Spark Connect interrupts the
operations carrying a tag (``addTag``, ``interruptTag``).
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

from ..session import spark_context_of

__all__ = ["JobGroup"]

log = logging.getLogger(__name__)

# The local properties setJobGroup sets (PySpark has no clearJobGroup): cleared on exit.
_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


class JobGroup:
    """``with JobGroup(spark, name, description):`` runs the thread's Spark jobs under ``name``; :meth:`cancel` stops them.

    Enter and exit in the thread that runs the jobs (job groups and tags are
    per thread); :meth:`cancel` may be called from any thread.
    """

    def __init__(self, spark: Any, name: str, description: str = "") -> None:
        self.spark = spark
        self.name = name
        self.description = description or name
        self._sc = spark_context_of(spark)
        self.cancelled = False

    def __enter__(self) -> JobGroup:
        if self._sc is not None:
            self._sc.setJobGroup(self.name, self.description, interruptOnCancel=True)
        else:
            self.spark.addTag(self.name)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._sc is not None:
            for name in _GROUP_PROPERTIES:
                self._sc.setLocalProperty(name, None)
        else:
            self.spark.removeTag(self.name)

    def cancel(self) -> None:
        """Cancel every job of the group that runs or will start (idempotent)."""
        self.cancelled = True
        try:
            if self._sc is not None:
                self._sc.cancelJobGroup(self.name)
            else:
                self.spark.interruptTag(self.name)
        except Exception:  # noqa: BLE001 - a session closing under us: its jobs end anyway
            log.exception("could not cancel the Spark jobs of %s", self.name)
