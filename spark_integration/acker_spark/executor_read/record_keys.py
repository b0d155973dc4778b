"""Which record a root is: the reader logs each tree's record identity as text, and operators look roots up by it.

A root id is derived from (run salt, identity hash, attempt) and cannot be
turned back into the record. So next to each task attempt's emission file the
reader writes ``p<partition>-t<attempt>.keys``: an Arrow IPC stream of
``(root, key)``, where ``key`` is the ``_record_key`` text the rows carry (the
key column's value, or ``path#row`` / ``path@block#index`` for files).
:func:`find_records` looks roots up in a checkpoint, for ``acker-ctl top`` and
``inspect --checkpoint DIR`` (the oldest trees of a cluster, by record).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..arrow_files import read_complete_batches
from ..task_roots import EMISSIONS_DIR

__all__ = ["KEYS_SCHEMA", "KeyWriter", "find_records"]

KEYS_SCHEMA = pa.schema([("root", pa.uint64()), ("key", pa.string())])
KEYS_SUFFIX = ".keys"  # not ".arrow": the round readers take only the emission files


class KeyWriter:
    """One task attempt's keys file next to its emission file, opened on the first batch."""

    def __init__(self, emission_path: Path) -> None:
        self.path = emission_path.with_suffix(KEYS_SUFFIX)
        self._file: Any = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def write(self, roots: np.ndarray, keys: pa.Array) -> None:
        """Append one batch's ``(root, key)`` rows."""
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "wb")  # noqa: SIM115 - held open across batches, closed in close()
            self._writer = pa.ipc.new_stream(self._file, KEYS_SCHEMA)
        self._writer.write_batch(
            pa.RecordBatch.from_arrays([pa.array(roots, pa.uint64()), keys.cast(pa.string())], schema=KEYS_SCHEMA)
        )
        self._file.flush()

    def close(self) -> None:
        """Finish the stream and close the file."""
        if self._writer is not None:
            self._writer.close()
            self._file.close()
            self._writer = self._file = None


def find_records(checkpoint: str | Path, roots: list[int]) -> dict[int, dict[str, Any]]:
    """For each root the checkpoint's run started: ``{"record": key text, "attempt": n, "round": r, "partition": p}``.

    Roots of another run, or of trees not started by this checkpoint's
    readers, are absent from the answer. Reads every emission file (a look-up
    for an operator, not a hot path).
    """
    folder = Path(checkpoint) / EMISSIONS_DIR
    if not folder.is_dir() or not roots:
        return {}
    wanted = np.array(sorted(set(roots)), dtype=np.uint64)
    found: dict[int, dict[str, Any]] = {}
    for round_name in sorted(os.listdir(folder)):
        round_dir = folder / round_name
        if not round_dir.is_dir():
            continue
        for name in sorted(os.listdir(round_dir)):
            if not name.endswith(".arrow"):
                continue
            for batch in read_complete_batches(round_dir / name):
                batch_roots = batch.column(0).to_numpy()
                hits = np.flatnonzero(np.isin(batch_roots, wanted))
                for i in hits.tolist():
                    found[int(batch_roots[i])] = {
                        "record": None,
                        "attempt": int(batch.column(2)[i].as_py()),
                        "round": int(round_name[1:]),
                        "partition": int(name[1:6]),
                        "_keys": round_dir / (name[: -len(".arrow")] + KEYS_SUFFIX),
                    }
    for keys_path in {info["_keys"] for info in found.values()}:
        for batch in read_complete_batches(keys_path):
            batch_roots = batch.column(0).to_numpy()
            for i in np.flatnonzero(np.isin(batch_roots, wanted)).tolist():
                root = int(batch_roots[i])
                if root in found:
                    found[root]["record"] = batch.column(1)[i].as_py()
    for info in found.values():
        del info["_keys"]
    return found
