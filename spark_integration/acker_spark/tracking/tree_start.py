"""Starting the trees of records an executor task has just read: the one place both executor readers do it.

The source pipeline's :class:`~acker_spark.executor_read.source_reader.SourceReader` and the
streaming source's :func:`~acker_spark.streaming.stream_source.read_partition` read
records differently (a DataFrame's Arrow batches, byte ranges of files); once
they have each record's identity and attempt number, starting its tree is the
same four steps, in this order:

1. derive each delivery's root from (run salt, identity, attempt), so a
   re-run task derives the same roots and the driver can name a replay's root;
2. derive each root's first edge;
3. append the roots to the task attempt's emission log, *before* the ackers
   hear of the trees: a tree the driver cannot find in the log would never be
   settled or replayed;
4. send the set-once inits column-wise (``init_columns``), or hand them to
   whatever sends them: the source reader passes an
   :class:`~acker_spark.tracking.init_sender.InitSender`, whose thread
   sends them while the task reads on (the log is written all the same).

The rows then carry the ``_acker_ids`` column (:mod:`acker_spark.steps.frames`) that
anchors each to its tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..steps.frames import PairColumn, encode_ids
from .emission_log import EmissionWriter
from .identity import derive_roots, first_edges

__all__ = ["StartedTrees", "start_trees"]


@dataclass(frozen=True)
class StartedTrees:
    """The trees of one batch of rows: their roots, first edges, and the rows' ``_acker_ids`` column."""

    roots: np.ndarray
    edges: np.ndarray
    ids: pa.Array


def start_trees(
    salt: int,
    idents: np.ndarray,
    attempts: np.ndarray,
    *,
    log: EmissionWriter | None,
    client: Any,
    spout: str,
) -> StartedTrees:
    """Start the trees of deliveries ``(idents[i], attempts[i])``: roots, first edges, emission log, inits, ids.

    ``client`` is anything with ``init_columns(roots, values, spout)``: a
    cluster client, or an :class:`~acker_spark.tracking.init_sender.InitSender`
    in front of one. ``client`` None runs the rows untracked: the same columns, logged, but no
    init sent and an ``_acker_ids`` column that names no tree.
    """
    roots = derive_roots(salt, idents, attempts)
    edges = first_edges(roots)
    if log is not None:
        log.write(roots, idents, attempts)  # logged before the ackers hear of the trees
    rows = len(roots)
    if client is None:
        return StartedTrees(
            roots, edges, encode_ids(PairColumn(np.zeros(rows + 1, dtype=np.int64), roots[:0], edges[:0]))
        )
    client.init_columns(roots, edges, spout)
    return StartedTrees(roots, edges, encode_ids(PairColumn(np.arange(rows + 1, dtype=np.int64), roots, edges)))
