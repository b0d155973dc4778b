"""Trees and entries an acker lifetime copied in and out, and the conservation identity they make checkable.

Trees reach a ledger three ways: an INIT applied here, a layout change's
handoff (the old owner's entries, removed there at its cut), or a restarted
replica's catch-up (a partner's copy of a range, which the partner keeps).
They leave by an outcome, by a handoff at this acker's own cut, or stay
pending. So, per incarnation (counters start at 0 when the process starts),
counting trees (entries whose init arrived; orphan entries are not trees)::

    inits + copied_in{handoff} + copied_in{catchup}
        == acked + failed + timed_out + pending + copied_out{handoff}

A snapshot given to a restarted partner (``copied_out{snapshot}``) removes
nothing here, so it is not in the identity; summed over a cluster, every
handoff tree counted out is counted in once its chunk is merged, and every
catch-up copy counted in at the restarted acker was counted out as a snapshot
by its partner. docs/acker-semantics.md ("Conservation you can check") states
the rules; :func:`balance_of` checks them from a scrape.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from acker_protocol.v1 import acker_pb2
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "Transfers",
    "Balance",
    "balance_of",
    "scrape_balance",
    "describe_balance",
    "HANDOFF",
    "CATCHUP",
    "SNAPSHOT",
]

HANDOFF, CATCHUP, SNAPSHOT = "handoff", "catchup", "snapshot"


@dataclass
class Transfers:
    """Counters of one acker lifetime: trees and entries (trees plus orphans) copied in and out, by way."""

    handoff_in_trees: int = 0
    handoff_in_entries: int = 0
    handoff_out_trees: int = 0
    handoff_out_entries: int = 0
    catchup_in_trees: int = 0
    catchup_in_entries: int = 0
    snapshot_out_trees: int = 0
    snapshot_out_entries: int = 0

    def copied_in(self) -> tuple[tuple[str, int, int], ...]:
        """(way, trees, entries) for every way in: a handoff merged here, a catch-up copy installed here."""
        return (
            (HANDOFF, self.handoff_in_trees, self.handoff_in_entries),
            (CATCHUP, self.catchup_in_trees, self.catchup_in_entries),
        )

    def copied_out(self) -> tuple[tuple[str, int, int], ...]:
        """(way, trees, entries) for every way out: a handoff at this acker's cut, a snapshot for a partner."""
        return (
            (HANDOFF, self.handoff_out_trees, self.handoff_out_entries),
            (SNAPSHOT, self.snapshot_out_trees, self.snapshot_out_entries),
        )


@dataclass(frozen=True)
class Balance:
    """Both sides of the per-incarnation identity, read from one acker's metrics."""

    inits: int
    copied_in: int  # trees, handoff and catch-up
    acked: int
    failed: int
    timed_out: int
    pending: int
    copied_out: int  # trees handed off (snapshots stay here and are not counted)

    @property
    def came(self) -> int:
        """Trees that arrived: inits plus trees copied in."""
        return self.inits + self.copied_in

    @property
    def went(self) -> int:
        """Trees accounted for: outcomes, pending now, and handed off."""
        return self.acked + self.failed + self.timed_out + self.pending + self.copied_out

    @property
    def holds(self) -> bool:
        """Whether every tree that arrived is accounted for exactly once."""
        return self.came == self.went

    def __str__(self) -> str:
        return (
            f"inits {self.inits} + copied in {self.copied_in} = {self.came}; acked {self.acked} + failed "
            f"{self.failed} + timed out {self.timed_out} + pending {self.pending} + copied out {self.copied_out} "
            f"= {self.went}"
        )


def balance_of(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> Balance:
    """The identity's terms from metric samples (name, labels, value), as a Prometheus scrape gives them."""
    values: dict[tuple[str, str], float] = {}
    for name, labels, value in samples:
        key = labels.get("outcome") or labels.get("via") or ""
        values[(name, key)] = values.get((name, key), 0.0) + value

    def get(name: str, key: str = "") -> int:
        return int(values.get((name, key), 0.0))

    return Balance(
        inits=get("acker_trees_initialized_total"),
        copied_in=get("acker_trees_copied_in_total", HANDOFF) + get("acker_trees_copied_in_total", CATCHUP),
        acked=get("acker_outcomes_total", "acked"),
        failed=get("acker_outcomes_total", "failed"),
        timed_out=get("acker_outcomes_total", "timed_out"),
        pending=get("acker_pending_trees"),
        copied_out=get("acker_trees_copied_out_total", HANDOFF),
    )


def scrape_balance(url: str, timeout: float = 5.0) -> Balance:
    """Scrape one acker's /metrics and return its :class:`Balance` (read it while no operation is in flight)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (an operator-given URL)
        text = response.read().decode()
    samples = (
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )
    return balance_of(samples)


def describe_balance(response: acker_pb2.DescribeResponse) -> Balance:
    """The identity's terms from one Describe answer (its ``tree_counts`` and ``pending_trees``)."""
    c = response.tree_counts
    return Balance(
        inits=c.trees_initialized,
        copied_in=c.trees_copied_in_handoff + c.trees_copied_in_catchup,
        acked=c.acked,
        failed=c.failed,
        timed_out=c.timed_out,
        pending=response.pending_trees,
        copied_out=c.trees_copied_out_handoff,
    )
