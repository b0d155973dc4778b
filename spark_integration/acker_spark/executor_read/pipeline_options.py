"""The options of a :class:`~acker_spark.executor_read.source_pipeline.SourcePipeline`, one frozen object.

``SourcePipeline(spark, client, checkpoint, policy=..., output=..., ...)``
takes these as keyword arguments (or whole, as ``options=``); the pipeline
keeps them as one :class:`PipelineOptions`. A pipeline built like another one
with a few differences (a redrive chunk's, a queue batch's) is
``dataclasses.replace(options, ...)``, or :meth:`PipelineOptions.sibling`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..budget import FailureBudget
from ..dead_letter import DeadLetterStore
from ..output import FileOutput, Output, TableOutput
from ..progress.display import ProgressMode, resolve_mode
from ..replay_policy import ReplayPolicy
from ..run_report import SourceStats

__all__ = ["PipelineOptions"]


@dataclass(frozen=True)
class PipelineOptions:
    """How a SourcePipeline runs: replays, dead letters, output, progress and the guards that stop a run.

    ``name`` is the spout name (default: the checkpoint's, or a fresh one).
    ``security`` and ``client_options`` configure the executors' clients, as
    for a Bolt. ``journal_interval``: how often outcomes that arrive during a
    job are journaled (each write is an ``fsync``; what a crash leaves
    unjournaled is still retained by the ackers). ``spout_timeout``: the
    backstop after which a tree with no outcome counts as lost (default: the
    cluster's). ``progress_interval``: the longest wait for outcomes between
    two looks at the replays due.

    ``on_undelivered``: ``"raise"`` (:class:`~acker_spark.run_report.AcksUndelivered`
    once every record is settled, if one was dead-lettered because its acks
    could not be delivered) or ``"warn"``. ``shard_down_after``: seconds a
    shard may stay unreachable before ``run`` raises
    :class:`~acker_spark.run_report.ShardDown` (None: wait forever);
    ``log_interval``: seconds between progress lines naming such a shard.

    ``output``: where the job's output goes, exactly once per record
    (:class:`~acker_spark.output.FileOutput`, :class:`~acker_spark.output.TableOutput`
    or :class:`~acker_spark.output.BatchOutput`); the job then returns its
    output DataFrame instead of running an action, the executors stage and ack
    it batch by batch, and the rows of the deliveries that ACKED are committed
    with Spark's writer once at the end (``commit_every="end"``) or whenever
    every started tree has settled (``"round"``). ``stall_after``: seconds after
    a successful job with none of its trees settled before the run stops,
    naming rows that no later step acked (default: half the backstop timeout).

    ``progress``: how a run shows its progress while it runs, Spark jobs
    included: ``"bar"`` (a rich progress bar on stderr: records read, acked,
    pending, replaying, dead, rate, ETA), ``"log"`` (that line at INFO every
    ``log_interval`` seconds while a job runs), ``"auto"`` (default: a bar when
    stderr is a terminal, else log lines) or None. Whatever it is, the run
    writes the same figures to ``progress.json`` in the checkpoint every
    ``progress_file_interval`` seconds, which ``acker-ctl progress --checkpoint
    DIR`` shows from another terminal. ``on_progress(stats)`` is still called
    from the driver thread between rounds.

    ``budget``: the run's :class:`~acker_spark.budget.FailureBudget` (default: stop
    once more than 5% of the records read, from 100 read, failed for good;
    None: never stop for failed records). It is checked every
    ``watch_interval`` seconds while a round's job runs (its Spark job group is
    cancelled at once) and between rounds; ``run`` then raises
    :class:`~acker_spark.budget.BudgetExceeded` naming the top causes, and the
    records not processed yet stay in the checkpoint. ``hang_grace``: a round
    whose job runs on although every tree it started has ended, some failed
    from outside (``acker-ctl fail``, a time limit), and no tree was started for
    ``hang_grace`` seconds, has a hung task: its job is cancelled and the
    failed records are replayed or dead-lettered as after a failed job (None:
    wait for the job).
    """

    name: str | None = None
    policy: ReplayPolicy = ReplayPolicy()
    dead_letters: DeadLetterStore | None = None
    spout_timeout: float | None = None
    progress_interval: float = 0.25
    journal_interval: float = 1.0
    clock: Callable[[], float] = time.monotonic
    security: Any = None
    client_options: dict[str, Any] = field(default_factory=dict)
    on_progress: Callable[[SourceStats], None] | None = None
    on_undelivered: Literal["raise", "warn"] = "raise"
    shard_down_after: float | None = 120.0
    log_interval: float = 10.0
    output: Output | None = None
    commit_every: Literal["round", "end"] = "end"
    stall_after: float | None = None
    progress: ProgressMode = "auto"
    progress_file_interval: float = 2.0
    budget: FailureBudget | None = FailureBudget()
    watch_interval: float = 0.1
    hang_grace: float | None = 5.0

    def __post_init__(self) -> None:
        # Refused when the pipeline is built, not at the end of a run.
        if self.commit_every not in ("round", "end"):
            raise ValueError(f'commit_every must be "round" or "end", got {self.commit_every!r}')
        if self.on_undelivered not in ("raise", "warn"):
            raise ValueError(f'on_undelivered must be "raise" or "warn", got {self.on_undelivered!r}')
        resolve_mode(self.progress)
        # A copy: the caller's dict may change after, the executors' clients must not.
        object.__setattr__(self, "client_options", dict(self.client_options or {}))

    def sibling(self, dead_letters: DeadLetterStore, budget: FailureBudget | None) -> PipelineOptions:
        """These options for a run that adds to this one's output: a redrive chunk's or a queue batch's.

        Its own dead-letter table and budget (a redrive's budget is for letters
        known to have failed, not for fresh records); an output that replaces or
        refuses what is there appends instead.
        """
        output = self.output
        if isinstance(output, (FileOutput, TableOutput)) and output.mode != "append":
            # The run adds to what the first one wrote: "overwrite" would drop it, "error" refuse it.
            output = dataclasses.replace(output, mode="append")
        # No name: the sibling's checkpoint is new, its spout name is its own.
        return dataclasses.replace(self, name=None, dead_letters=dead_letters, budget=budget, output=output)
