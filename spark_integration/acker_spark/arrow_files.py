"""Arrow IPC stream files written batch by batch by a process that may die mid-write: read what is whole."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

__all__ = ["read_complete_batches"]


def read_complete_batches(path: Path) -> list[pa.RecordBatch]:
    """The whole batches of an Arrow IPC stream; a torn last batch (its writer died mid-write) is left out."""
    batches = []
    try:
        with pa.OSFile(str(path), "rb") as source:
            reader = pa.ipc.open_stream(source)
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
    except (pa.ArrowInvalid, OSError, EOFError):
        pass  # a torn tail: the batches before it are complete
    return batches
