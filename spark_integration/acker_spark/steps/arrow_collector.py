"""ArrowCollector: a bolt's emits, acks and fails for whole Arrow batches, column-wise, held until the task commits.

The columnar counterpart of :class:`~acker_client.bolt.BoltCollector` for
:class:`~acker_spark.steps.arrow_bolt.ArrowBolt`. For the input batch being processed
it keeps, per input row, the XOR of its children's edge ids (Storm's
``out_ack_val``), how many children it has had (the next ordinal) and whether it
was acked or failed. ``emit(batch, anchors)`` anchors output row ``k`` to input
row ``anchors[k]``: one numpy expression derives every child's edge id from the
bolt's uid, the parent's MessageId digest and the child's ordinal, so a Spark
re-run derives the same ids. Acks and fails are held, XOR-folded per root, and
sent as one columnar commit when the partition is done.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from acker_client import ShardUnavailable
from acker_client.columns import derive_ids, distinct, fold_xor, mix64

from ..job_errors import job_error
from .frames import TRACKING_COLUMN, PairColumn, child_pairs, encode_ids

__all__ = ["ArrowCollector", "Rows", "acks_key"]

Rows = Any
"""Which input rows: an int index array, a boolean mask as long as the batch, a ``slice``, or one int."""

_EMPTY = np.zeros(0, dtype=np.uint64)


class ArrowCollector:
    """Emits output batches anchored to input rows, and acks or fails input rows, vectorised (one task).

    ``salt`` is the bolt's uid (None: untracked, the same checks and outputs
    without ids). ``out_schema`` is the Arrow schema of the emitted user
    columns (None: the bolt emits nothing).
    """

    def __init__(self, salt: int | None, out_schema: pa.Schema | None, client: Any = None) -> None:
        self.salt = salt
        self.out_schema = out_schema
        self.client = client
        self._start_batch(PairColumn(np.zeros(1, dtype=np.int64), _EMPTY, _EMPTY))  # no batch yet: no rows
        self._held_roots: list[np.ndarray] = []
        self._held_values: list[np.ndarray] = []
        self._held_fails: list[np.ndarray] = []
        self.undelivered: tuple[int, ...] = ()  # roots of the last commit that could not be delivered
        # root -> the reason fail() gave (first wins); the bolt reports them with its commits
        self.fail_reasons: dict[int, str] = {}

    @property
    def tracking(self) -> bool:
        """True when the collector derives ids and holds acks (the bolt has acker addresses)."""
        return self.salt is not None

    # -- the user-facing API -------------------------------------------------------

    def emit(self, batch: Any, anchors: Any) -> None:
        """Emit ``batch``'s rows; output row ``k`` is anchored to input row ``anchors[k]`` (-1: unanchored).

        ``batch`` is a ``pyarrow.RecordBatch`` or ``Table``, a pandas DataFrame
        or a dict of columns, with the output schema's columns (by name; cast to
        their types). ``anchors`` is an int array as long as ``batch`` (or one
        int for every row). An input row may anchor any number of children, over
        any number of ``emit`` calls, until it is acked or failed.
        """
        table = self._output_table(batch)
        rows = self._current.rows
        anchors = np.asarray(anchors)
        if anchors.size == 0:
            anchors = anchors.astype(np.int64)  # [] is float64 to numpy
        if anchors.dtype.kind not in "iu":
            raise TypeError(f"anchors must be integers (input row indexes, -1 for none), not {anchors.dtype}")
        if anchors.ndim > 1 or (anchors.ndim == 1 and len(anchors) != table.num_rows):
            raise ValueError(f"anchors has shape {anchors.shape}; the emitted batch has {table.num_rows} rows")
        anchors = np.broadcast_to(anchors.astype(np.int64), (table.num_rows,))
        if len(anchors) and (anchors.max() >= rows or anchors.min() < -1):
            raise ValueError(f"anchors must be input row indexes in [0, {rows}) or -1 (unanchored)")
        anchored = anchors[anchors >= 0]
        if self._settled[anchored].any():
            row = int(anchored[self._settled[anchored]][0])
            raise ValueError(f"cannot anchor to input row {row}: it was already acked or failed")
        edges = self._edges(anchored)
        full = np.zeros(len(anchors), dtype=np.uint64)
        full[anchors >= 0] = edges
        ids = encode_ids(child_pairs(self._current, anchors, full)) if self.tracking else _no_ids(table.num_rows)
        columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
        self._out.append(pa.RecordBatch.from_arrays([*columns, ids], names=[*table.column_names, TRACKING_COLUMN]))

    def ack(self, rows: Rows) -> None:
        """Ack input ``rows`` now (their children are registered with the ack); the rest are acked on return."""
        mask = self._mark_settled_rows(rows)
        if self.tracking:
            self._hold_acks(mask)

    def fail(self, rows: Rows, reason: str | Any = None) -> None:
        """Fail input ``rows``: each tree they belong to fails, and its spout replays the record.

        ``reason`` says why: one text for every row, or one per failed row (in
        row order); the pipeline keeps it as the dead letter's ``cause``. An
        exception (or one per row) is written as a raising row's cause is,
        ``Type: message (at file:line in function)``, so the replay policy
        reads its type: a vectorised function that can tell which rows are bad
        fails them this way and returns, and its batch runs once.
        """
        mask = self._mark_settled_rows(rows)
        if self.tracking:
            selected = np.flatnonzero(mask)
            index, starts = self._current.gather(selected)
            roots = self._current.roots[index]
            self._held_fails.append(roots)
            if reason is not None:
                self._keep_reasons(roots, np.diff(starts), reason, len(selected))

    def _keep_reasons(self, roots: np.ndarray, counts: np.ndarray, reason: Any, rows: int) -> None:
        """Remember each failed row's reason for every root it carries (a root's first reason is kept)."""
        if isinstance(reason, (str, BaseException)):
            per_row = [_cause_text(reason)] * rows
        else:
            per_row = [_cause_text(r) for r in reason]
            if len(per_row) != rows:
                raise ValueError(f"{len(per_row)} reasons for {rows} failed rows: give one text, or one per row")
        for root, text in zip(roots.tolist(), np.repeat(np.asarray(per_row, dtype=object), counts).tolist()):
            self.fail_reasons.setdefault(root, text)

    def reset_timeout(self, rows: Rows) -> None:
        """Give every tree of input ``rows`` a fresh acker timeout (sent at once: it changes no checksum)."""
        mask = self._mask(rows)
        if self.tracking and self.client is not None:
            index, _ = self._current.gather(np.flatnonzero(mask))
            self.client.reset_timeout_columns(self._current.roots[index])

    # -- the bolt's side -------------------------------------------------------------

    def _start_batch(self, parents: PairColumn) -> None:
        """Begin an input batch: no children, ordinals or settlements yet."""
        self._current = parents
        self._digests: np.ndarray | None = None
        self._out_ack = np.zeros(parents.rows, dtype=np.uint64)
        self._ordinals = np.zeros(parents.rows, dtype=np.int64)
        self._settled = np.zeros(parents.rows, dtype=bool)
        self._out: list[pa.RecordBatch] = []

    def _mark(self) -> tuple[int, int, int, int]:
        """Where the held lists and reasons stand now (see :meth:`_roll_back`)."""
        return len(self._held_roots), len(self._held_values), len(self._held_fails), len(self.fail_reasons)

    def _roll_back(self, mark: tuple[int, int, int, int]) -> None:
        """Forget what a call of the function that raised held, emitted or gave as reasons since ``mark``."""
        roots, values, fails, reasons = mark
        del self._held_roots[roots:], self._held_values[values:], self._held_fails[fails:]
        for root in list(self.fail_reasons)[reasons:]:  # a dict keeps insertion order
            del self.fail_reasons[root]
        self._out = []

    def _finish_batch(self) -> list[pa.RecordBatch]:
        """The function returned: ack every row it neither acked nor failed; return the batches it emitted."""
        if self.tracking:
            self._hold_acks(~self._settled)
        self._settled[:] = True
        out, self._out = self._out, []
        return out

    def _edges(self, anchored: np.ndarray) -> np.ndarray:
        """Edge ids of new children of ``anchored`` rows (in order), XORed into their parents' out values."""
        if not self.tracking or not len(anchored):
            return np.zeros(len(anchored), dtype=np.uint64)
        assert self.salt is not None
        if self._digests is None:
            self._digests = self._current.digests()
        # Ordinal of each child among its parent's children: the parent's count so
        # far plus the child's rank among this call's children of the same parent.
        order = np.argsort(anchored, kind="stable")
        ranked = anchored[order]
        heads = np.flatnonzero(np.concatenate(([True], ranked[1:] != ranked[:-1])))
        rank = np.empty(len(anchored), dtype=np.int64)
        rank[order] = np.arange(len(anchored)) - np.repeat(heads, np.diff(np.append(heads, len(anchored))))
        ordinals = self._ordinals[anchored] + rank
        self._ordinals += np.bincount(anchored, minlength=self._current.rows)
        edges = derive_ids(self.salt, self._digests[anchored], ordinals.astype(np.uint64))
        np.bitwise_xor.at(self._out_ack, anchored, edges)
        return edges

    def _hold_acks(self, mask: np.ndarray) -> None:
        """Hold the ack of every pair of the ``mask`` rows: its id XOR the row's children's edges."""
        rows = np.flatnonzero(mask)
        index, starts = self._current.gather(rows)
        values = self._current.ids[index] ^ np.repeat(self._out_ack[rows], np.diff(starts))
        roots, values = fold_xor(self._current.roots[index], values)
        self._held_roots.append(roots)
        self._held_values.append(values)

    def _mask(self, rows: Rows) -> np.ndarray:
        count = self._current.rows
        if isinstance(rows, slice):
            mask = np.zeros(count, dtype=bool)
            mask[rows] = True
            return mask
        array = np.asarray(rows)
        if array.size == 0 and array.dtype != bool:
            array = array.astype(np.int64)  # [] is float64 to numpy
        if array.dtype == bool:
            if array.shape != (count,):
                raise ValueError(
                    f"a boolean mask of rows must have one entry per input row ({count}), not {array.shape}"
                )
            return array.copy()
        if array.dtype.kind not in "iu":
            raise TypeError(f"rows must be indexes, a boolean mask or a slice, not an array of {array.dtype}")
        array = array.reshape(-1).astype(np.int64)
        if len(array) and (array.min() < 0 or array.max() >= count):
            raise ValueError(f"row indexes must be in [0, {count}) (the input batch's rows)")
        mask = np.zeros(count, dtype=bool)
        mask[array] = True
        return mask

    def _mark_settled_rows(self, rows: Rows) -> np.ndarray:
        """The mask of ``rows``, now marked acked or failed; a row settled before is refused."""
        mask = self._mask(rows)
        twice = mask & self._settled
        if twice.any():
            # Acking a row twice would XOR its id back in and hang (or falsely complete) its tree.
            raise ValueError(f"input row {int(np.flatnonzero(twice)[0])} was already acked or failed")
        self._settled |= mask
        return mask

    def _output_table(self, batch: Any) -> pa.Table:
        if self.out_schema is None:
            raise ValueError("this bolt has no output schema (a sink): it cannot emit; give ArrowBolt a schema=")
        if isinstance(batch, pa.RecordBatch):
            table = pa.Table.from_batches([batch])
        elif isinstance(batch, pa.Table):
            table = batch
        elif isinstance(batch, dict):
            table = pa.table(batch)
        elif hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # a pandas DataFrame
            table = pa.Table.from_pandas(batch, preserve_index=False)
        else:
            raise TypeError(
                f"emit a pyarrow RecordBatch or Table, a pandas DataFrame or a dict of columns, not {type(batch).__name__}"
            )
        names = self.out_schema.names
        missing = [n for n in names if n not in table.column_names]
        extra = [n for n in table.column_names if n not in names]
        if missing or extra:
            raise ValueError(
                f"emitted columns {table.column_names} do not match the output schema's {names}"
                f" (missing {missing}, unexpected {extra})"
            )
        try:
            return table.select(names).cast(self.out_schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise ValueError(f"emitted columns do not convert to the output schema {self.out_schema}: {err}") from None

    def commit(self, dedup_key: int = 0) -> None:
        """Send the held fails and acks (folded per root, carrying ``dedup_key``) in one columnar commit; flush.

        Raises what the client raises when a shard cannot be reached (the bolt counts it).
        """
        fails = np.concatenate(self._held_fails) if self._held_fails else _EMPTY
        roots = np.concatenate(self._held_roots) if self._held_roots else _EMPTY
        values = np.concatenate(self._held_values) if self._held_values else _EMPTY
        self.discard()
        self.undelivered = ()
        if self.client is None:
            return
        roots, values = fold_xor(roots, values)
        try:
            if len(fails):
                self.client.fail_columns(fails)
            if len(roots):
                self.client.ack_columns(roots, values, dedup_key=dedup_key)
            self.client.flush()
        except ShardUnavailable as err:
            # Name the trees this commit could not reach (as BoltCollector does), so the
            # driver reports them as ACKS_UNDELIVERED rather than as slow work.
            every = distinct(np.concatenate((fails, roots)))
            count = getattr(self.client, "shard_count", None)
            if err.shards and isinstance(count, int):
                every = every[np.isin(every % np.uint64(count), np.asarray(err.shards, dtype=np.uint64))]
            self.undelivered = tuple(every.tolist())
            raise

    def content_key(self, salt: int) -> int:
        """A dedup key for the held acks: equal whenever the same acks are held, whichever task attempt holds them.

        A re-run that repeats a batch exactly sends the same key, which the
        ackers drop; one that cuts its batches differently sends other keys,
        and a row acked twice reappears in its tree (which then times out and
        is replayed): it can never complete a tree falsely.
        """
        roots = np.concatenate(self._held_roots) if self._held_roots else _EMPTY
        values = np.concatenate(self._held_values) if self._held_values else _EMPTY
        return acks_key(salt, *fold_xor(roots, values))

    def withhold(self, shards: set[int], shard_count: int) -> tuple[int, ...]:
        """Drop the held acks and fails of trees on ``shards`` (known unreachable); return their roots."""
        on = np.asarray(sorted(shards), dtype=np.uint64)
        count = np.uint64(shard_count)
        gone: list[np.ndarray] = []
        for held in (self._held_fails, self._held_roots):
            for i, roots in enumerate(held):
                mine = np.isin(roots % count, on)
                if mine.any():
                    gone.append(roots[mine])
                    held[i] = roots[~mine]
                    if held is self._held_roots:
                        self._held_values[i] = self._held_values[i][~mine]
        return tuple(np.unique(np.concatenate(gone)).tolist()) if gone else ()

    def discard(self) -> None:
        """Drop the held acks and fails (the attempt failed; its re-run sends its own)."""
        self._held_roots, self._held_values, self._held_fails = [], [], []

    @property
    def held(self) -> int:
        """Held (already per-batch folded) acks plus held fails: what the next commit sends at most."""
        return sum(len(r) for r in self._held_roots) + sum(len(f) for f in self._held_fails)


def acks_key(salt: int, roots: np.ndarray, values: np.ndarray) -> int:
    """A dedup key for folded acks ``(roots, values)``: the same for the same acks, whoever sends them; 0 for none.

    Order-independent (an XOR of per-pair mixes), salted so that two steps'
    equal acks do not share a key; never 0 for acks (0 means no key on the wire).
    """
    if not len(roots):
        return 0
    mixed = mix64(mix64(roots ^ np.uint64(salt & 0xFFFF_FFFF_FFFF_FFFF)) ^ values)
    return int(np.bitwise_xor.reduce(mixed)) or 1


def _cause_text(reason: Any) -> str:
    """A fail reason as a dead letter's cause: an exception as ``Type: message (at ...)``, anything else as text."""
    return str(job_error(reason)) if isinstance(reason, BaseException) else str(reason)


def _no_ids(rows: int) -> pa.Array:
    """An untracked ``_acker_ids`` column: every value empty."""
    return pa.Array.from_buffers(
        pa.binary(), rows, [None, pa.py_buffer(np.zeros(rows + 1, dtype=np.int32)), pa.py_buffer(b"")]
    )
