"""``acker-ctl progress --checkpoint DIR``: a running pipeline's figures, read from its checkpoint's progress.json.

The pipeline (``SourcePipeline``) rewrites ``progress.json`` every few seconds
while it runs, with the wall-clock time of each write and how old the file may
get before it means the driver is gone (``stale_after``). This reads it with
the standard library only (no acker call, no Spark), so it works from any
terminal that can read the checkpoint directory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .cluster import CtlError

__all__ = ["PROGRESS_FILE", "read_progress", "progress_text"]

PROGRESS_FILE = "progress.json"  # the name acker_spark.progress.figures writes


def read_progress(checkpoint: str, now: float | None = None) -> dict[str, Any]:
    """The checkpoint's figures plus ``age_seconds`` and ``stale`` (a "running" file older than its stale_after)."""
    path = Path(checkpoint) / PROGRESS_FILE
    if not Path(checkpoint).is_dir():
        raise CtlError(f"{checkpoint} is not a directory: give the pipeline's checkpoint directory")
    try:
        figures = json.loads(path.read_text())
    except FileNotFoundError:
        raise CtlError(
            f"no {PROGRESS_FILE} in {checkpoint}: no pipeline has run on this checkpoint yet, or it is not a "
            "SourcePipeline checkpoint"
        ) from None
    except (OSError, ValueError) as exc:
        raise CtlError(f"cannot read {path}: {exc}") from None
    age = (time.time() if now is None else now) - float(figures["updated_at"])
    figures["age_seconds"] = round(max(0.0, age), 1)
    figures["stale"] = figures["state"] == "running" and age > float(figures["stale_after"])
    return figures


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def progress_text(figures: dict[str, Any]) -> str:
    """The figures as a few lines for a terminal; the first says whether the run is running."""
    name, age = figures["name"], _duration(figures["age_seconds"])
    if figures["stale"]:
        head = (
            f"run {name}: NOT RUNNING (stale): the last figures are {age} old; the driver stopped or was killed "
            "without finishing. Run the pipeline again on this checkpoint to continue it."
        )
    elif figures["state"] == "running":
        job = f"round {figures['round']}'s Spark job running" if figures["in_job"] else "between rounds"
        head = f"run {name}: running, {job} (figures {age} old)"
    else:
        head = f"run {name}: {figures['state']} {age} ago"
    records = figures["records"]
    of = f" of {records:,}" if records is not None else ""
    eta = figures["eta_seconds"]
    lines = [
        head,
        f"read {figures['read']:,}{of}   acked {figures['acked']:,}   pending {figures['pending']:,}   "
        f"replaying {figures['replaying']:,}   dead {figures['dead']:,}",
        f"rate {figures['rate']:,.0f} records/s   ETA {_duration(eta) if eta is not None else '-'}   "
        f"elapsed {_duration(figures['elapsed_seconds'])}",
    ]
    return "\n".join(lines)
