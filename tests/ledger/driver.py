"""The ledger tests' one way into an engine: the :class:`~acker_service.ledger.Ledger` contract.

Tests state batches as :class:`~acker_service.batch.Batch` arrays and read
outcomes as :class:`~acker_service.outcome_columns.Resolution` lists, which is
how the spec reads. :class:`Driver` turns a batch into ``ApplyRequest`` bytes
(the packed encoder the client uses) and the contract's outcome columns back
into resolutions, and calls nothing on the engine that the server does not
call, so every ledger test (the differential one included) checks the contract.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from acker_protocol.packed import encode_apply_request

from acker_service.batch import Batch
from acker_service.ledger import UNLIMITED, Ledger, Limits
from acker_service.native_ledger import NativeLedger
from acker_service.outcome_columns import Resolution
from acker_service.reference_ledger import BatchResult, ReferenceLedger

__all__ = ["Driver", "ENGINES", "request_of"]


def request_of(batch: Batch) -> bytes:
    """The serialized ``ApplyRequest`` of a batch (as a client would send it)."""
    return encode_apply_request(
        np.asarray(batch.kinds, dtype=np.uint64),
        batch.roots,
        batch.values,
        batch.dedup_keys,
        batch.spouts,
        np.asarray(batch.spout_index, dtype=np.uint64) if len(batch.spout_index) else None,
    )


class Driver:
    """A ledger engine seen through the contract only; other attributes pass through (counters, properties)."""

    def __init__(self, ledger: Ledger) -> None:
        assert isinstance(ledger, Ledger)
        self.ledger = ledger

    def __getattr__(self, name: str):
        return getattr(self.ledger, name)

    def apply_batch(self, batch: Batch, max_expired: int | None = None, limits: Limits = UNLIMITED) -> BatchResult:
        """Apply a batch through ``Ledger.apply``; outcomes as resolutions."""
        result = self.ledger.apply(request_of(batch), limits, max_expired)
        return BatchResult(
            result.applied,
            result.deduplicated,
            result.ignored,
            result.ended.resolutions(),
            result.timeout_resets.resolutions(),
        )

    def advance(self) -> list[Resolution]:
        """Every tree that timed out (``Ledger.advance`` without a limit)."""
        columns, more = self.ledger.advance(None)
        assert not more, "an unlimited advance left due trees behind"
        return columns.resolutions()

    def advance_some(self, max_expired: int | None) -> tuple[list[Resolution], bool]:
        """At most ``max_expired`` timed-out trees and whether more are due."""
        columns, more = self.ledger.advance(max_expired)
        return columns.resolutions(), more

    def force_fail(self, roots: Sequence[int]) -> list[Resolution]:
        """The trees ``Ledger.force_fail`` ended, as resolutions."""
        return self.ledger.force_fail(roots).resolutions()

    def force_fail_spout(self, spout: str) -> list[Resolution]:
        """The trees ``Ledger.force_fail_spout`` ended, as resolutions."""
        return self.ledger.force_fail_spout(spout).resolutions()


def _driven(engine: type) -> Callable[..., Driver]:
    def make(*args, **kwargs) -> Driver:
        return Driver(engine(*args, **kwargs))

    make.__name__ = engine.__name__
    return make


# Every ledger test runs against both: the reference model and the native core.
ENGINES: dict[str, Callable[..., Driver]] = {"reference": _driven(ReferenceLedger), "native": _driven(NativeLedger)}
