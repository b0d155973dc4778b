"""Old module paths of acker_spark, still importable for one release: each import warns and names the new path.

When a module moves, a job that imports it by its old path should keep
running for a release and say what to change, not fail with
``ModuleNotFoundError``. :data:`MOVED` maps each old path to its new one;
:data:`REMOVED` names the modules that went, and what replaces them.
:func:`install` (``import acker_spark`` runs it) puts the finder of
:mod:`acker_protocol.moved_modules` for these tables on ``sys.meta_path``.
CHANGELOG.md lists the same moves and removals; an entry leaves these tables
one release after it was added.
"""

from __future__ import annotations

from acker_protocol.moved_modules import MovedModules

__all__ = ["MOVED", "REMOVED", "install"]

# Old path -> new path. Moved in 0.1.0, when acker_spark's modules went into steps/, executor_read/ and streaming/.
MOVED: dict[str, str] = {
    "acker_spark.arrow_bolt": "acker_spark.steps.arrow_bolt",
    "acker_spark.arrow_collector": "acker_spark.steps.arrow_collector",
    "acker_spark.arrow_rows": "acker_spark.steps.arrow_rows",
    "acker_spark.executor": "acker_spark.steps.executor",
    "acker_spark.frames": "acker_spark.steps.frames",
    "acker_spark.ids": "acker_spark.steps.ids",
    "acker_spark.layout": "acker_spark.steps.layout",
    "acker_spark.leases": "acker_spark.steps.leases",
    "acker_spark.step": "acker_spark.steps.step",
    "acker_spark.book": "acker_spark.tracking.book",
    "acker_spark.checkpoint": "acker_spark.tracking.checkpoint",
    "acker_spark.emission_log": "acker_spark.tracking.emission_log",
    "acker_spark.identity": "acker_spark.tracking.identity",
    "acker_spark.memory_source": "acker_spark.executor_read.memory_source",
    "acker_spark.outcome_feed": "acker_spark.tracking.outcome_feed",
    "acker_spark.record_table": "acker_spark.tracking.record_table",
    "acker_spark.source_pipeline": "acker_spark.executor_read.source_pipeline",
    "acker_spark.source_reader": "acker_spark.executor_read.source_reader",
    "acker_spark.stream_planner": "acker_spark.streaming.stream_planner",
    "acker_spark.stream_undelivered": "acker_spark.streaming.stream_undelivered",
    "acker_spark.tree_start": "acker_spark.tracking.tree_start",
    "acker_spark.stream_options": "acker_spark.streaming.stream_options",
    "acker_spark.stream_source": "acker_spark.streaming.stream_source",
    # Moved in 0.2.0, when a run's progress went into progress/.
    "acker_spark.run_progress": "acker_spark.progress.figures",
    "acker_spark.progress_display": "acker_spark.progress.display",
    # Moved in 0.2.0, when the tracking layer under the drivers went into tracking/ and the stream's planner
    # beside its source.
    "acker_spark.executor_read.book": "acker_spark.tracking.book",
    "acker_spark.executor_read.checkpoint": "acker_spark.tracking.checkpoint",
    "acker_spark.executor_read.emission_log": "acker_spark.tracking.emission_log",
    "acker_spark.executor_read.record_table": "acker_spark.tracking.record_table",
    "acker_spark.executor_read.outcome_feed": "acker_spark.tracking.outcome_feed",
    "acker_spark.executor_read.identity": "acker_spark.tracking.identity",
    "acker_spark.executor_read.tree_start": "acker_spark.tracking.tree_start",
    "acker_spark.executor_read.round_tally": "acker_spark.tracking.round_tally",
    "acker_spark.executor_read.init_sender": "acker_spark.tracking.init_sender",
    "acker_spark.executor_read.stream_planner": "acker_spark.streaming.stream_planner",
    "acker_spark.executor_read.stream_undelivered": "acker_spark.streaming.stream_undelivered",
    # Root modules that serve one folder, moved into it in 0.2.0.
    "acker_spark.shard_watch": "acker_spark.executor_read.shard_watch",
    "acker_spark.job_group": "acker_spark.executor_read.job_group",
}

# Removed path (and every module under it) -> what to use instead. Removed in 0.2.0.
REMOVED: dict[str, str] = {
    "acker_spark.driver_fed": (
        "the driver-fed GuaranteedPipeline was removed: run the records through SourcePipeline"
        " (SourcePipeline(spark, client, checkpoint).run(records_from(values), job)); docs/spark.md,"
        ' "Moving from GuaranteedPipeline to SourcePipeline", shows the steps'
    ),
}

_FINDER = MovedModules(MOVED, REMOVED)


def install() -> None:
    """Make the old paths of :data:`MOVED` and :data:`REMOVED` answer (once)."""
    _FINDER.install()
