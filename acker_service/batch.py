"""A batch of ledger operations as parallel arrays, and its validation.

The gRPC layer decodes an ``ApplyRequest`` into a :class:`Batch`; the ledger
applies a batch only after :func:`validate_batch` accepted it whole, so a bad
request changes nothing. Validation is vectorised with numpy because it runs
on every operation of the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from acker_protocol.apply_codec import UndecodableRequest, decode_apply_request, not_an_apply_request
from acker_protocol.wire import OpKind, check_spout_name, shard_of

from .ledger import Limits

__all__ = [
    "Batch",
    "BatchError",
    "InvalidBatch",
    "BatchTooLarge",
    "WrongShard",
    "validate_batch",
    "check_request",
    "undecodable",
]


@dataclass
class Batch:
    """Operations ``i`` = (kinds[i], roots[i], values[i], dedup_keys[i], spout of op i).

    ``dedup_keys`` may be empty (no keys). ``spout_index`` may be empty when
    ``spouts`` has at most one name; then every INIT belongs to ``spouts[0]``.
    """

    kinds: np.ndarray
    roots: np.ndarray
    values: np.ndarray
    dedup_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    spouts: list[str] = field(default_factory=list)
    spout_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))

    @classmethod
    def of(
        cls,
        kinds,
        roots,
        values,
        dedup_keys=(),
        spouts=(),
        spout_index=(),
    ) -> Batch:
        """Build a batch from any sequences (lists, protobuf repeated fields, arrays)."""
        return cls(
            kinds=np.asarray(kinds, dtype=np.int64),
            roots=np.asarray(roots, dtype=np.uint64),
            values=np.asarray(values, dtype=np.uint64),
            dedup_keys=np.asarray(dedup_keys, dtype=np.uint64),
            spouts=list(spouts),
            spout_index=np.asarray(spout_index, dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.kinds)


class BatchError(ValueError):
    """A batch was refused as a whole; nothing of it was applied."""


class InvalidBatch(BatchError):
    """The batch is malformed (maps to INVALID_ARGUMENT)."""


class BatchTooLarge(BatchError):
    """The batch has more operations than the server accepts (RESOURCE_EXHAUSTED)."""


class WrongShard(BatchError):
    """A root belongs to another shard (FAILED_PRECONDITION)."""


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def undecodable(detail: object) -> InvalidBatch:
    """The refusal for request bytes that are not an ApplyRequest (INVALID_ARGUMENT, never UNKNOWN)."""
    return InvalidBatch(not_an_apply_request(detail))


def check_request(data: bytes, limits: Limits) -> Batch:
    """Decode serialized ``ApplyRequest`` bytes and validate them whole as Apply would; the operations.

    Raises the :class:`BatchError` Apply would raise (:func:`undecodable` for
    bytes that do not decode), so a request routed per operation (a layout
    change's holds, a catch-up's) is refused at once, whole, never half applied.
    """
    try:
        columns = decode_apply_request(data)
    except UndecodableRequest as exc:
        raise undecodable(exc.detail) from exc
    batch = Batch(*columns)
    validate_batch(
        batch,
        shard_index=limits.shard_index,
        shard_count=limits.shard_count,
        max_batch=limits.max_batch,
        replicas=limits.replicas,
    )
    return batch


def validate_batch(batch: Batch, *, shard_index: int, shard_count: int, max_batch: int, replicas: int = 1) -> None:
    """Raise a :class:`BatchError` naming the first problem, or return if the batch is valid.

    With ``replicas`` 2 the shard also accepts the roots it follows (those of the previous shard).
    """
    n = len(batch.kinds)
    if n > max_batch:
        raise BatchTooLarge(
            f"batch has {n} operations, more than this acker's maximum of {max_batch}; "
            f"split it into batches of at most {max_batch}"
        )
    lengths = {"root_ids": len(batch.roots), "values": len(batch.values)}
    for name, length in lengths.items():
        if length != n:
            raise InvalidBatch(f"kinds has {n} entries but {name} has {length}; the arrays must be parallel")
    if len(batch.dedup_keys) not in (0, n):
        raise InvalidBatch(
            f"dedup_keys has {len(batch.dedup_keys)} entries; send none or exactly one per operation ({n})"
        )
    if n == 0:
        return
    unknown = (batch.kinds < OpKind.INIT) | (batch.kinds > OpKind.RESET_TIMEOUT)
    if unknown.any():
        i = _first(unknown)
        raise InvalidBatch(
            f"operation {i} has unknown kind {int(batch.kinds[i])}; "
            "expected INIT (1), ACK (2), FAIL (3) or RESET_TIMEOUT (4)"
        )
    zero_root = batch.roots == 0
    if zero_root.any():
        raise InvalidBatch(f"operation {_first(zero_root)} has root id 0; root ids must be non-zero")
    valueless = (batch.kinds >= OpKind.FAIL) & (batch.values != 0)
    if valueless.any():
        i = _first(valueless)
        raise InvalidBatch(f"operation {i} is {OpKind(int(batch.kinds[i])).name} with a non-zero value; send 0")
    _validate_spouts(batch)
    if shard_count > replicas:  # otherwise every shard keeps every root
        _check_ownership(batch, shard_index, shard_count, replicas)


def _check_ownership(batch: Batch, shard_index: int, shard_count: int, replicas: int) -> None:
    """WrongShard unless every root is owned by this shard or, with replicas 2, by the one before it."""
    owner = batch.roots % np.uint64(shard_count)
    # How far this shard is after each root's owner: 0 = owns it, 1 = follows it.
    distance = (np.int64(shard_index) - owner.astype(np.int64)) % shard_count
    foreign = distance >= replicas
    if foreign.any():
        i = _first(foreign)
        root = int(batch.roots[i])
        owner_index = shard_of(root, shard_count)
        followers = "".join(f" and shard {(owner_index + k) % shard_count}" for k in range(1, replicas))
        raise WrongShard(
            f"root {root} belongs to shard {owner_index}{followers} of {shard_count}, "
            f"but this acker is shard {shard_index}; check the client's address order"
        )


def _validate_spouts(batch: Batch) -> None:
    for name in batch.spouts:
        try:
            check_spout_name(name)
        except ValueError as exc:
            raise InvalidBatch(str(exc)) from None
    inits = batch.kinds == OpKind.INIT
    n = len(batch.kinds)
    if len(batch.spout_index) == 0:
        if len(batch.spouts) > 1:
            raise InvalidBatch(
                f"{len(batch.spouts)} spouts given but no spout_index; send one spout index per operation"
            )
        if inits.any() and not batch.spouts:
            raise InvalidBatch(f"operation {_first(inits)} is INIT but the request names no spout")
        return
    if len(batch.spout_index) != n:
        raise InvalidBatch(
            f"spout_index has {len(batch.spout_index)} entries; send none or exactly one per operation ({n})"
        )
    out_of_range = inits & ((batch.spout_index < 0) | (batch.spout_index >= len(batch.spouts)))
    if out_of_range.any():
        i = _first(out_of_range)
        raise InvalidBatch(
            f"operation {i} is INIT with spout index {int(batch.spout_index[i])}, "
            f"but only {len(batch.spouts)} spouts are named"
        )
