"""``acker-ctl top|inspect --checkpoint DIR``: name each tree's record from a SourcePipeline's checkpoint.

A root id names no record (it is derived from the run's salt, the record's
identity hash and the attempt). The pipeline's readers log each tree's record
identity as text in the checkpoint (``acker_spark.executor_read.record_keys``);
this adds it to the trees acker-ctl shows, so the oldest pending trees of a
cluster read as "k00042, attempt 2" instead of a 64-bit number. Reading those
Arrow files needs the Spark integration's packages (``pyspark-acker[spark]``),
imported only when ``--checkpoint`` is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .cluster import CtlError

__all__ = ["add_records"]


def add_records(trees: list[dict[str, Any]], checkpoint: str) -> None:
    """Set ``record``, ``attempt`` and ``round`` on each tree (None for roots the checkpoint's run did not start)."""
    if not Path(checkpoint).is_dir():
        raise CtlError(f"{checkpoint} is not a directory: give the pipeline's checkpoint directory")
    try:
        from acker_spark.executor_read.record_keys import find_records
    except ImportError as exc:
        raise CtlError(
            f"--checkpoint reads the pipeline's Arrow files, which needs pyspark-acker[spark] ({exc})"
        ) from None
    found = find_records(checkpoint, [t["root"] for t in trees])
    for tree in trees:
        info = found.get(tree["root"], {})
        tree["record"] = info.get("record")
        tree["attempt"] = info.get("attempt")
        tree["round"] = info.get("round")
