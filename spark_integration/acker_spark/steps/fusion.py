"""One Python pass per stage: consecutive ``mapInArrow`` steps of ours run as one function.

Spark runs each ``mapInArrow`` as its own plan node: every row crosses the
JVM/Python boundary once per step. The pipeline's reading step, the user's
``ArrowBolt`` steps and the output stager are such steps, so a job that runs
them back to back with no shuffle between them would pay that crossing three
times where the plain job pays it once.

:func:`map_in_arrow` is what our steps call instead of ``df.mapInArrow``: it
remembers each frame it makes (its base frame, the chain of functions, and
the schema). When the frame a step is applied to is one of ours, or a
selection of plain columns of one of ours (``df.select("a", "_acker_ids")``,
renames included: ``df.selectExpr("_record_key AS key", ...)``),
the new step is appended to the chain and run over the base frame as a
single ``mapInArrow`` (:class:`ArrowChain`). Anything else between two
steps (a shuffle, an expression Spark computes, a cached frame) keeps them
apart, exactly as before. Per-batch work inside each function is unchanged:
the chain just feeds each function's output batches to the next one in the
same Python worker.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["ArrowChain", "Columns", "map_in_arrow", "python_steps"]

log = logging.getLogger(__name__)

ArrowFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


@dataclass(frozen=True)
class Columns:
    """A selection of plain columns, by name, possibly renamed (``df.select("a", col("b").alias("c"))``), as a link."""

    names: tuple[str, ...]  # the input columns taken
    as_names: tuple[str, ...]  # their names in the output

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Each batch with only ``names``, in that order, named ``as_names``."""
        for batch in batches:
            yield pa.RecordBatch.from_arrays([batch.column(n) for n in self.names], names=list(self.as_names))


@dataclass(frozen=True)
class ArrowChain:
    """The picklable ``mapInArrow`` function of several steps: each one's output batches are the next one's input."""

    functions: tuple[ArrowFunction, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Run the chain over one task's batches."""
        stream: Iterator[pa.RecordBatch] = batches
        for function in self.functions:
            stream = function(stream)
        return stream


@dataclass
class _Made:
    frame: Any  # weakref.ref to the frame we made
    base: Any  # the frame the chain runs over
    functions: tuple[ArrowFunction, ...]
    plan: Any = None  # the frame's analyzed plan (a JVM object), to know a selection of it once the frame is gone


_made: dict[int, _Made] = {}
_KEEP_GONE = 64  # frames no longer held whose plans are kept: ``bolt.apply_df(df).select(...)`` holds none


def map_in_arrow(df: Any, function: ArrowFunction, schema: Any) -> Any:
    """``df.mapInArrow(function, schema)``, run in the same Python pass as the step that made ``df`` when it can be."""
    link = _chain_of(df)
    functions: tuple[ArrowFunction, ...]
    if link is None:
        out = df.mapInArrow(function, schema)
        base, functions = df, (function,)
    else:
        base, chained = link
        functions = (*chained, function)
        out = base.mapInArrow(ArrowChain(functions), schema)
    _remember(out, base, functions)
    return out


def python_steps(df: Any) -> int:
    """How many Python ``mapInArrow`` nodes ``df``'s physical plan runs (tests and checks)."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    plan = plan.split("== Initial Plan ==")[0]  # an adaptive plan that ran shows its final and initial plans
    return sum(1 for line in plan.splitlines() if "MapInArrow" in line)


def _remember(out: Any, base: Any, functions: tuple[ArrowFunction, ...]) -> None:
    # A frame the job no longer holds may still be the child of a selection it holds
    # (``bolt.apply_df(df).select("a", "_acker_ids")`` drops the bolt's frame at once): the
    # newest such entries are kept by their plans, the older ones dropped.
    gone = [k for k, made in _made.items() if made.frame() is None]
    for key in gone[: max(0, len(gone) - _KEEP_GONE)]:
        del _made[key]
    try:
        ref = weakref.ref(out)
    except TypeError:  # a frame that takes no weak reference: left unfused
        return
    try:
        plan = out._jdf.queryExecution().analyzed()
    except Exception:  # noqa: BLE001 - a frame we cannot look into (Spark Connect): fused while it is held only
        plan = None
    _made[id(out)] = _Made(ref, base, functions, plan)


def _chain_of(df: Any) -> tuple[Any, tuple[ArrowFunction, ...]] | None:
    """``(base, functions)`` if ``df`` is one of our frames, or a plain column selection of one; else None."""
    if getattr(df, "is_cached", False):
        return None  # its rows come from the cache: running the steps again would redo their work
    made = _made.get(id(df))
    if made is not None and made.frame() is df:
        return made.base, made.functions
    try:
        return _selection_of(df)
    except Exception:  # noqa: BLE001 - a frame we cannot look into (Spark Connect): not fused
        log.debug("no fusion through this frame", exc_info=True)
        return None


def _selection_of(df: Any) -> tuple[Any, tuple[ArrowFunction, ...]] | None:
    """If ``df`` is ``ours.select(plain columns)``: ours' chain plus the selection."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None or not _made:
        return None
    plan = jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() != "Project":
        return None
    projection = plan.projectList()
    names, as_names = [], []
    for i in range(projection.size()):
        expression = projection.apply(i)
        as_names.append(expression.name())
        if expression.getClass().getSimpleName() == "Alias":
            expression = expression.child()  # a renamed column: the same values
        if expression.getClass().getSimpleName() != "AttributeReference":
            return None  # Spark computes something here: it stays a step of its own
        names.append(expression.name())
    child = plan.child()
    caching: bool | None = None  # whether the session caches anything (asked once, if a gone frame matches)
    for made in reversed(list(_made.values())):  # the newest first: the likeliest parent
        frame = made.frame()
        if frame is not None and getattr(frame, "is_cached", False):
            continue
        known = made.plan if made.plan is not None else (frame._jdf.queryExecution().analyzed() if frame else None)
        if known is None or not known.equals(child):
            continue
        if frame is None:
            # Gone, it cannot say whether it was cached; with anything cached in the session, the
            # selection may read a cache of it: not fused (running the steps again would redo their work).
            if caching is None:
                caching = not df.sparkSession._jsparkSession.sharedState().cacheManager().isEmpty()
            if caching:
                return None
        return made.base, (*made.functions, Columns(tuple(names), tuple(as_names)))
    return None
