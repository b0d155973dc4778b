"""An acker's place in the shard layout and the three steps of changing it (issue 29), without gRPC or clock.

A layout is (epoch, shard count, this acker's index, the addresses of every
shard); the design's rule holds inside each one: root ``r`` belongs to shard
``r % count``. A change goes prepare -> cut -> commit on every acker of the old
and the new layout, driven by ``acker-ctl reshard`` / ``drain``:

* ``prepare``: the acker learns its place in the next layout and holds Apply
  (clients get UNAVAILABLE and retry), so no update lands while entries move.
* ``cut``: the acker hands the entries the next layout gives away to their new
  owners (the servicer does the sending; see :mod:`acker_service.reshard`).
* ``commit``: the acker takes the next layout and serves again; a root it no
  longer owns is refused with FAILED_PRECONDITION, and the client learns the
  new layout from Describe.

Why no rule breaks through a move: docs/acker-semantics.md, "Moving trees".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .batch import BatchError

__all__ = ["Layout", "LayoutMachine", "LayoutRefused", "ApplyHeld", "SERVING", "PREPARED", "CUT"]

SERVING, PREPARED, CUT = "serving", "prepared", "cut"


class LayoutRefused(Exception):
    """A layout step out of order or with a bad layout (FAILED_PRECONDITION); nothing changed."""


class ApplyHeld(BatchError):
    """Apply is held while entries move (UNAVAILABLE): retry the same batch; nothing was applied."""


@dataclass(frozen=True)
class Layout:
    """Shard ``index`` of ``count`` in layout ``epoch``; ``index`` -1: not in it (drained)."""

    epoch: int
    count: int
    index: int
    addresses: tuple[str, ...] = field(default_factory=tuple)

    def owns(self, root: int) -> bool:
        """Whether this acker owns ``root`` in this layout."""
        return self.index >= 0 and root % self.count == self.index

    def check(self) -> None:
        """Raise LayoutRefused unless the layout is coherent."""
        if self.count < 1:
            raise LayoutRefused(f"a layout needs at least one shard, got {self.count}")
        if not -1 <= self.index < self.count:
            raise LayoutRefused(f"shard index {self.index} is outside 0..{self.count - 1} (or -1: leaving)")
        if self.addresses and len(self.addresses) != self.count:
            raise LayoutRefused(
                f"a layout of {self.count} shards needs {self.count} addresses, got {len(self.addresses)}"
            )


class LayoutMachine:
    """The current layout and a change in progress; the shard asks it before each Apply."""

    def __init__(self, initial: Layout) -> None:
        initial.check()
        self.current = initial
        self.next: Layout | None = None
        self.state = SERVING
        self.moved_trees = 0  # handed over by the last cut
        self.moved_entries = 0

    @property
    def holding(self) -> bool:
        """Whether Apply is held (a change is between prepare and commit)."""
        return self.state != SERVING

    def prepare(self, layout: Layout) -> None:
        """Hold Apply and remember the next layout (again with the same layout: a no-op, so a retried call is safe)."""
        layout.check()
        if self.next == layout and self.state in (PREPARED, CUT):
            return
        if self.state != SERVING:
            raise LayoutRefused(
                f"a change to epoch {self.next.epoch if self.next else '?'} is in progress ({self.state}); "
                "finish it (acker-ctl reshard again with the same shards) before starting another"
            )
        if layout.epoch <= self.current.epoch:
            raise LayoutRefused(f"layout epoch {layout.epoch} is not above the current {self.current.epoch}")
        self.next = layout
        self.state = PREPARED

    def start_cut(self, epoch: int) -> Layout:
        """The layout to cut to; refused unless ``epoch`` was prepared (a repeated cut is allowed: it moves what is left)."""
        if self.next is None or self.next.epoch != epoch:
            raise LayoutRefused(f"epoch {epoch} was not prepared on this acker; call PrepareLayout first")
        return self.next

    def cut_done(self, trees: int, entries: int) -> None:
        """Record a finished cut."""
        self.state = CUT
        self.moved_trees += trees
        self.moved_entries += entries

    def accepts_handoff(self, epoch: int) -> bool:
        """Whether moved entries of ``epoch`` may be merged now (prepared or cut for it)."""
        return self.next is not None and self.next.epoch == epoch and self.state in (PREPARED, CUT)

    def commit(self, epoch: int, record: Callable[[Layout], None] | None = None) -> Layout:
        """Take the next layout and serve again (committing the current epoch again is a no-op).

        ``record`` is called with the layout once the commit is allowed and before it
        is taken (the acker keeps it durable there, :mod:`acker_service.layout_file`).
        """
        if self.next is None and self.current.epoch == epoch:
            return self.current
        if self.next is None or self.next.epoch != epoch or self.state != CUT:
            raise LayoutRefused(f"epoch {epoch} cannot commit here ({self.state}); every acker must be cut first")
        if record is not None:
            record(self.next)
        self.current, self.next, self.state = self.next, None, SERVING
        return self.current
