"""A test oracle for the word-count pipelines: every delivery's outcome, and any false ack."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from acker_demo.wordcount import tokenize
from acker_protocol.wire import Outcome
from acker_spark.sqlite import open_db

__all__ = ["AckAudit"]


class AckAudit:
    """A pipeline ``on_outcome`` hook: every delivery's outcome, and any false ack.

    A false ack is a record reported ACKED while some of its words are not in the
    sink yet, which only a tree completed before its last edge was acked can
    cause. Tests (and a cautious operator) pass it to ``GuaranteedPipeline``.
    """

    def __init__(self, db_path: str | Path, records: Iterable[tuple[str, str]]) -> None:
        self.db_path = db_path
        self.words = {key: len(tokenize(text)) for key, text in records}
        self.outcomes: dict[str, list[Outcome]] = {}
        self.false_acks: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, delivery: Any, outcome: Outcome) -> None:
        """Record ``delivery``'s outcome; on ACKED, check its words are all in the sink now."""
        if outcome is Outcome.ACKED:
            with open_db(self.db_path) as conn:
                (rows,) = conn.execute("SELECT COUNT(*) FROM words WHERE record_key = ?", (delivery.key,)).fetchone()
            if rows != self.words[delivery.key]:
                self.false_acks.append(delivery.key)
        with self._lock:
            self.outcomes.setdefault(delivery.key, []).append(outcome)

    def first_failures(self) -> dict[str, Outcome]:
        """Keys whose first delivery failed, with the reason."""
        return {key: seq[0] for key, seq in self.outcomes.items() if seq[0] is not Outcome.ACKED}
