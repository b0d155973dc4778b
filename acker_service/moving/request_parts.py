"""A request applied in parts: the operations that may apply now apply, the others are held per source, in order.

Outside a layout change or a catch-up the ledger engine takes the request bytes
whole. During one, an operation on a root whose entries have not arrived yet
(its old owner's handoff, its range's copy) must wait (:mod:`.held`), so the
request, validated whole first (:func:`~acker_service.batch.check_request`: a
refused request changes nothing), is split by the shared codec
(:mod:`acker_protocol.apply_codec`) into the part that applies now and one part
per source, every field of each operation kept: the dedup keys above all,
which make a held ACK re-sent after the move a recognised repeat.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from acker_protocol.apply_codec import encode_part, split_by

from ..batch import Batch
from ..ledger import Ledger, Limits
from ..outcome_columns import ColumnarResult, OutcomeColumns
from .held import HeldOperations
from .layout import ApplyHeld

__all__ = ["apply_in_parts"]


def apply_in_parts(
    ledger: Ledger,
    data: bytes,
    batch: Batch,
    source: np.ndarray,
    held: HeldOperations,
    limits: Limits,
    refusal: Callable[[int], str],
) -> ColumnarResult:
    """Apply the operations of ``batch`` (``data``'s) whose ``source`` is -1 now and hold the others per source.

    Nothing is applied or held when the operations to hold pass ``held``'s
    bound: :class:`~.layout.ApplyHeld` (UNAVAILABLE) carries ``refusal(n)``'s
    message. The result counts the operations held (``result.held``).
    """
    holding = source >= 0
    n_held = int(holding.sum())
    if not n_held:
        result = ledger.apply(data, limits, max_expired=0)
    elif not held.room_for(n_held):
        raise ApplyHeld(refusal(n_held))
    elif n_held < len(batch):
        result = ledger.apply(encode_part(batch, ~holding), limits, max_expired=0)
    else:
        result = ColumnarResult(0, 0, 0, OutcomeColumns.empty(), OutcomeColumns.empty())
    # Held after the part applied now: that one could still have been refused (it never is, validated).
    for key, part in split_by(batch, source).items():
        held.hold(key, part, int((source == key).sum()))
    result.held = n_held
    return result
