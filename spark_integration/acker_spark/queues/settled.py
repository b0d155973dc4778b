"""The drain's ledger of settled messages: which broker ids a finished batch committed or dead-lettered, and why.

Written after a batch's output is committed and before the broker hears of
it. A broker that redelivers a message whose ack was lost (a driver killed
between the commit and the ack; a RabbitMQ channel closed, so its delivery
tags are void) hands the drain a message it already processed: the ledger
names it, and the drain acks it (or dead-letters it with its recorded cause)
without processing it again. One JSON file per batch, written whole
(temporary file, fsync, rename).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["SettledLedger"]


class SettledLedger:
    """The settled ids of every finished batch in ``folder``: id -> None (acked) or the dead letter's cause."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._settled: dict[str, str | None] = {}
        for path in sorted(folder.glob("batch-*.json")) if folder.exists() else []:
            entry = json.loads(path.read_text())
            self._settled.update(dict.fromkeys(entry["acked"]))
            self._settled.update(entry["dead"])

    def __contains__(self, message_id: str) -> bool:
        return message_id in self._settled

    def __len__(self) -> int:
        return len(self._settled)

    def cause(self, message_id: str) -> str | None:
        """The recorded cause of a dead-lettered message; None for an acked one."""
        return self._settled[message_id]

    def record(self, batch: int, acked: Iterable[str], dead: Mapping[str, str]) -> None:
        """Record batch ``batch``'s outcome durably (before the broker is told)."""
        acked = list(acked)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"batch-{batch:06d}.json"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as out:
            json.dump({"acked": acked, "dead": dict(dead)}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        self._settled.update(dict.fromkeys(acked))
        self._settled.update(dead)
