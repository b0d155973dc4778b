"""Record identities for sources read by Spark: which one a DataFrame gets, how it is hashed, and root ids from it.

A record read on the executors must be found again by its identity when it is
replayed, and a re-run task must derive the same root ids, so the identity has
to be the same on every read of the source. Three kinds are stable:

- ``key``: a column the user names (any reader); the column must be unique and
  non-null. Replays keep the rows whose key is among the failed ones.
- ``file_row``: Parquet's ``_metadata.file_path`` and ``_metadata.row_index``
  (the row's position in its file, whatever the splits).
- ``file_line``: line-based formats (text, CSV, JSON): ``_metadata.file_path``,
  ``_metadata.file_block_start`` and the row's index within its split. That
  index is stable only if every read splits the files the same way, so the
  pipeline pins what Spark's split size depends on (the file set and sizes,
  ``spark.sql.files.maxPartitionBytes``, ``openCostInBytes`` and
  ``minPartitionNum``), records it in the checkpoint, and replays by re-reading
  the same whole source and keeping the wanted rows.

Anything else (no key, no file metadata, e.g. ``spark.range`` or a join) is
refused with :class:`UnstableIdentity`.

Everything per row is numpy: an identity becomes one uint64 (``pandas``'
vectorised ``hash_array`` for strings, the splitmix64 mixer for integers), and
a delivery's root id is mixed from (run salt, identity hash, attempt).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from acker_client.columns import U64, mix64

from ..run_report import RunError

__all__ = [
    "IdentitySpec",
    "UnstableIdentity",
    "resolve_identity",
    "hash_strings",
    "hash_key_column",
    "derive_roots",
    "first_edges",
    "PATH_COLUMN",
    "BLOCK_COLUMN",
    "ROW_COLUMN",
    "PINNED_CONF",
]

PATH_COLUMN = "__acker_file_path"
BLOCK_COLUMN = "__acker_block_start"
ROW_COLUMN = "__acker_row_index"

PINNED_CONF = (
    "spark.sql.files.maxPartitionBytes",
    "spark.sql.files.openCostInBytes",
    "spark.sql.files.minPartitionNum",
)
"""What Spark's file split size depends on besides the files: pinned for ``file_line`` identities."""

_KEY_DOMAIN = np.uint64(0x61636B65722F6B79)  # "acker/ky"
_FILE_DOMAIN = np.uint64(0x61636B65722F666C)  # "acker/fl"
_ROOT_DOMAIN = np.uint64(0x61636B65722F7274)  # "acker/rt"
_FIRST_EDGE_DOMAIN = np.uint64(0x61636B65722F6665)  # "acker/fe"
_HASH_KEY = "acker-identity01"  # pandas' hash_array key: 16 bytes, fixed so every process agrees


class UnstableIdentity(RunError, ValueError):
    """The source's records have no identity that stays the same across reads (the message says what to do)."""


@dataclass(frozen=True)
class IdentitySpec:
    """How a source's records are identified: ``kind`` is ``key``, ``file_row`` or ``file_line``.

    ``column`` is the key column (``key`` only); ``fingerprint`` what must not
    change between reads (files, sizes, pinned settings) for file identities.
    """

    kind: str
    column: str | None = None
    fingerprint: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON-able form, for the checkpoint."""
        return {"kind": self.kind, "column": self.column, "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IdentitySpec:
        """The inverse of :meth:`as_json`."""
        return cls(data["kind"], data.get("column"), data.get("fingerprint"))

    def with_columns(self, df: Any) -> Any:
        """``df`` plus the hidden file-metadata columns this identity reads (``key``: ``df`` itself)."""
        from pyspark.sql import functions as F

        if self.kind == "key":
            return df
        extra = [F.col("_metadata.file_path").alias(PATH_COLUMN)]
        if self.kind == "file_row":
            extra.append(F.col("_metadata.row_index").alias(ROW_COLUMN))
        else:
            extra.append(F.col("_metadata.file_block_start").alias(BLOCK_COLUMN))
        return df.select("*", *extra)


def resolve_identity(spark: Any, df: Any, key: str | None) -> IdentitySpec:
    """The identity of ``df``'s records: the ``key`` column, else one from file metadata; or UnstableIdentity."""
    if key is not None:
        if key not in df.columns:
            raise UnstableIdentity(f"key column {key!r} is not a column of the source (columns: {df.columns})")
        return IdentitySpec("key", key)
    fields = _metadata_fields(df)
    if fields is None:
        raise UnstableIdentity(
            "the source has no stable record identity: it is not a file source read directly by spark.read "
            "(no _metadata column; e.g. spark.range, a join or an aggregation), so a re-read could not find a "
            "failed record again. Name a unique, non-null column: run(df, job, key='id')."
        )
    files = sorted(df.inputFiles())
    fingerprint: dict[str, Any] = {"files": files, "sizes": _local_sizes(files)}
    if "row_index" in fields:
        return IdentitySpec("file_row", fingerprint=fingerprint)
    fingerprint["conf"] = pinned_conf(spark)
    return IdentitySpec("file_line", fingerprint=fingerprint)


def pinned_conf(spark: Any) -> dict[str, str]:
    """The session's split settings for a ``file_line`` source, ``minPartitionNum`` set to today's parallelism.

    Unset, ``spark.sql.files.minPartitionNum`` follows the cluster's cores,
    which change when executors come and go; the pipeline sets it, so a replay
    splits the files as the first read did.
    """
    from ..session import default_parallelism

    values = {name: _conf(spark, name) for name in PINNED_CONF}
    if values["spark.sql.files.minPartitionNum"] is None:
        values["spark.sql.files.minPartitionNum"] = str(default_parallelism(spark))
    return {name: str(value) for name, value in values.items()}


def _conf(spark: Any, name: str) -> str | None:
    """A setting's value, its default included (``conf.get(name, None)`` hides defaults); None if it has none."""
    try:
        return spark.conf.get(name)
    except Exception:  # noqa: BLE001 - no value and no default (classic and Connect raise differently)
        return None


def apply_pinned_conf(spark: Any, spec: IdentitySpec) -> None:
    """Set the session's split settings to those recorded for a ``file_line`` identity (no-op otherwise)."""
    if spec.kind != "file_line" or not spec.fingerprint:
        return
    for name, value in spec.fingerprint["conf"].items():
        spark.conf.set(name, value)


def check_unchanged(recorded: IdentitySpec, current: IdentitySpec) -> None:
    """Raise UnstableIdentity if the source or its identity changed since the checkpoint recorded it."""
    if recorded.kind != current.kind or recorded.column != current.column:
        raise UnstableIdentity(
            f"the checkpoint's source was identified by {recorded.kind} {recorded.column or ''}, this one by "
            f"{current.kind} {current.column or ''}: use the same source and key, or a new checkpoint directory"
        )
    old, new = recorded.fingerprint or {}, current.fingerprint or {}
    for part in ("files", "sizes"):
        if old.get(part) != new.get(part):
            raise UnstableIdentity(
                f"the source's files changed since the checkpoint was written ({part} differ): its records' "
                "identities would point at other data. Restore the files, or start a new checkpoint directory."
            )


def _metadata_fields(df: Any) -> list[str] | None:
    try:
        return list(df.select("_metadata").schema[0].dataType.fieldNames())
    except Exception:  # noqa: BLE001 - AnalysisException (classic or Connect): no file metadata
        return None


def _local_sizes(files: list[str]) -> list[list[int]] | None:
    """``[size, mtime_ns]`` of each file when all are local (a ``file:`` URL); None when they are not."""
    out = []
    for name in files:
        url = urlparse(name)
        if url.scheme not in ("", "file"):
            return None
        stat = os.stat(unquote(url.path))
        out.append([stat.st_size, stat.st_mtime_ns])
    return out


# -- executor side: hashing and ids ------------------------------------------------------


def hash_strings(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A stable 64-bit hash of each string (or binary) value, vectorised; distinct values of a batch hashed once."""
    encoded = pc.dictionary_encode(values)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    from pandas.util import hash_array

    dictionary = encoded.dictionary.to_numpy(zero_copy_only=False)
    hashes = np.asarray(hash_array(dictionary.astype(object), hash_key=_HASH_KEY, categorize=False), dtype=U64)
    return hashes[encoded.indices.to_numpy(zero_copy_only=False)]


def hash_key_column(values: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """The identity hash of each key value: integers mixed, anything else hashed as its string form."""
    if values.null_count:
        raise UnstableIdentity(f"key column {name!r} has null values: a record without a key cannot be replayed")
    kind = values.type
    if pa.types.is_integer(kind):
        ints = values.cast(pa.int64()).to_numpy(zero_copy_only=False).view(U64)
        return mix64(ints ^ _KEY_DOMAIN)
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)):
        values = values.cast(pa.string())
    with np.errstate(over="ignore"):
        return mix64(hash_strings(values) + _KEY_DOMAIN)


def hash_file_rows(paths: pa.Array, positions: np.ndarray, blocks: np.ndarray | None = None) -> np.ndarray:
    """The identity hash of rows given by file path, (block start,) and position."""
    with np.errstate(over="ignore"):
        h = mix64(hash_strings(paths) ^ _FILE_DOMAIN)
        if blocks is not None:
            h = mix64(h + blocks.astype(U64))
        return mix64(h + positions.astype(U64))


def derive_roots(salt: int, idents: np.ndarray, attempts: np.ndarray) -> np.ndarray:
    """Non-zero root ids, deterministic in (run ``salt``, identity hash, attempt): re-runs re-send the same inits."""
    with np.errstate(over="ignore"):
        keyed = mix64(np.asarray([salt], dtype=U64) ^ _ROOT_DOMAIN)[0]
        roots = mix64(mix64(np.asarray(idents, dtype=U64) ^ keyed) + np.asarray(attempts, dtype=U64))
    return _nonzero(roots, keyed)


def first_edges(roots: np.ndarray) -> np.ndarray:
    """Each root's first edge id (the init value and the id the first bolt acks), derived from the root."""
    return _nonzero(mix64(roots ^ _FIRST_EDGE_DOMAIN), _FIRST_EDGE_DOMAIN)


def _nonzero(ids: np.ndarray, key: np.uint64) -> np.ndarray:
    zero = ids == 0
    while zero.any():  # 0 means "no tree" on the wire: rehash the (2^-64-likely) zeros, deterministically
        ids[zero] = mix64(ids[zero] ^ key)
        zero = ids == 0
    return ids
