"""The ledger engines a server can run: ``native`` (the Rust core, default) and ``reference``.

Both offer the ledger interface plus the two calls of the server's hot path:
``apply_request`` (serialized ``ApplyRequest`` bytes in, outcome columns out; a
request that does not decode is an ``InvalidBatch``) and ``advance_columns``.
The reference engine does in Python what the native core does in Rust.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeAlias

from acker_protocol.v1 import acker_pb2
from google.protobuf.message import DecodeError

from .batch import Batch, InvalidBatch, validate_batch
from .config import ENGINES
from .outcome_columns import ColumnarResult, OutcomeColumns
from .reference_ledger import ReferenceLedger

if TYPE_CHECKING:
    from .native_ledger import NativeLedger

__all__ = ["ENGINES", "DEFAULT_ENGINE", "ReferenceEngine", "Engine", "new_ledger", "undecodable"]

DEFAULT_ENGINE = "native"


def undecodable(detail: object) -> InvalidBatch:
    """The refusal for request bytes that are not an ApplyRequest (INVALID_ARGUMENT, never UNKNOWN)."""
    return InvalidBatch(
        f"the request is not a valid acker_service.v1.ApplyRequest ({detail}); "
        "send a message encoded from proto/acker_protocol/v1/acker.proto"
    )


class ReferenceEngine(ReferenceLedger):
    """The reference ledger with the server's hot-path calls, decoding with protobuf in Python."""

    engine = "reference"

    def apply_request(
        self, data: bytes, *, shard_index: int, shard_count: int, max_batch: int, max_expired: int | None = None
    ) -> ColumnarResult:
        """Decode, validate whole, then apply; raise a BatchError subclass and change nothing on refusal.

        At most ``max_expired`` due trees are collected first (None: all), as in ``apply_batch``.
        """
        try:
            request = acker_pb2.ApplyRequest.FromString(data)
        except DecodeError as exc:
            raise undecodable(exc) from exc
        batch = Batch.of(
            request.kinds, request.root_ids, request.values, request.dedup_keys, request.spouts, request.spout_index
        )
        validate_batch(batch, shard_index=shard_index, shard_count=shard_count, max_batch=max_batch)
        result = self.apply_batch(batch, max_expired)
        return ColumnarResult(
            result.applied,
            result.deduplicated,
            result.ignored,
            OutcomeColumns.from_resolutions(result.resolutions),
            OutcomeColumns.from_resolutions(result.timeout_resets),
        )

    def advance_columns(self) -> OutcomeColumns:
        """Rotate as due; the trees that timed out, as columns."""
        return OutcomeColumns.from_resolutions(self.advance())

    def advance_some_columns(self, max_expired: int | None) -> tuple[OutcomeColumns, bool]:
        """:meth:`advance_some` with the timed-out trees as columns."""
        resolutions, more = self.advance_some(max_expired)
        return OutcomeColumns.from_resolutions(resolutions), more

    def force_fail_columns(self, roots: Iterable[int]) -> OutcomeColumns:
        """:meth:`force_fail` with the ended trees as columns."""
        return OutcomeColumns.from_resolutions(self.force_fail(roots))

    def force_fail_spout_columns(self, spout: str) -> OutcomeColumns:
        """:meth:`force_fail_spout` with the ended trees as columns."""
        return OutcomeColumns.from_resolutions(self.force_fail_spout(spout))


# What the server holds: either engine (they share the ledger interface and the hot-path calls).
Engine: TypeAlias = "NativeLedger | ReferenceEngine"


def new_ledger(
    engine: str,
    message_timeout: float,
    buckets: int = 3,
    clock: Callable[[], float] = time.monotonic,
    *,
    timeout_mode: str = "fixed",
    max_tree_lifetime: float = 0.0,
) -> Engine:
    """A ledger of the named engine (``native`` needs the built extension ``acker_service._native``).

    ``timeout_mode`` and ``max_tree_lifetime`` (0: no cap) are the progress-timeout rules (issue 21).
    """
    if engine == "native":
        from .native_ledger import NativeLedger  # only this engine needs the extension

        return NativeLedger(
            message_timeout, buckets, clock, timeout_mode=timeout_mode, max_tree_lifetime=max_tree_lifetime
        )
    if engine == "reference":
        return ReferenceEngine(
            message_timeout, buckets, clock, timeout_mode=timeout_mode, max_tree_lifetime=max_tree_lifetime
        )
    raise ValueError(f"unknown ledger engine {engine!r}; choose one of {', '.join(ENGINES)}")
