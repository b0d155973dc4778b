"""The simulated client: routing by layout, retries that duplicate, replica copies, and its skip rule.

Every operation goes to each of its holders as an independent *copy*, re-sent
(same operation, same dedup key) until an acker answers ``ok``: a lost reply
therefore duplicates it. A refusal names the acker's layout; a newer one is
adopted and the copy re-routed. A copy for an acker that is down (connection
refused) waits and retries; with two replicas it is skipped instead once the
other copy was applied by a live incarnation. When an acker crashes, the
copies it had applied of operations whose other copy is still in flight are
sent again (see the catch-up protocol in :mod:`acker_service.simulation.acker`).

Copies travel in *batches*, as the real client's buffers do: a copy for an
acker waits up to ``FLUSH_SECONDS`` for others bound there and they go as one
message, lost, duplicated or refused together; the answer settles each copy.
A batch refused at the acker's bound of held operations is retried, never
skipped (``--broken bound-skip`` skips it as for an unreachable replica).
Every copy carries the epoch of the layout it was routed by (read only by
``--broken source-to-both``). With two replicas a refusal that names a newer
layout sends *every* copy of the operation again by that layout, whatever the
other copy's answer was (see "Reshard with two replicas" in
:mod:`acker_service.simulation.acker`). An acker may be *partitioned*: up, but
unreachable for the clients, which treat its copies as for a down one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .acker import HELD_FULL, RETRY_SECONDS, Layout, SimAcker
from .events import World
from .transfer import Op

__all__ = ["SimClient", "FLUSH_SECONDS"]

# How long a copy waits in its acker's buffer for others (the client's flush interval).
FLUSH_SECONDS = 0.005


@dataclass
class _Copy:
    role: int  # 0: the owner's copy, 1: the follower's
    attempt: int = 0
    applied_by: tuple[int, int] | None = None  # (acker id, incarnation)
    skipped: bool = False

    @property
    def done(self) -> bool:
        return self.applied_by is not None or self.skipped


@dataclass
class _Pending:
    op: Op
    copies: list[_Copy]
    epoch: int = 0  # the layout its copies are routed by
    generation: int = 0  # bumped when every copy is sent again by a newer layout: older answers are ignored


@dataclass
class SimClient:
    """One client process (a spout's or a bolt's): its layout view and its operations in flight."""

    world: World
    ackers: dict[int, SimAcker]
    layout: Layout
    replicas: int
    broken: str | None = None
    skipped: int = 0
    _open: dict[int, _Pending] = field(default_factory=dict)
    _ids: int = 0
    # Per acker: the copies buffered for its next batch (key, operation, copy, attempt, epoch, generation).
    _buffers: dict[int, list[tuple[int, _Pending, _Copy, int, int, int]]] = field(default_factory=dict)

    def submit(self, op: Op) -> None:
        """Send ``op`` to each of its holders until delivered."""
        self._ids += 1
        pending = _Pending(op, [_Copy(role) for role in range(self.replicas)], self.layout.epoch)
        self._open[self._ids] = pending
        for copy in pending.copies:
            self._send(self._ids, pending, copy)

    @property
    def in_flight(self) -> int:
        """Operations not yet delivered to every live holder."""
        return len(self._open)

    def _alive(self, applied_by: tuple[int, int] | None) -> bool:
        if applied_by is None:
            return False
        acker = self.ackers[applied_by[0]]
        return acker.up and acker.incarnation == applied_by[1]

    def _send(self, key: int, pending: _Pending, copy: _Copy) -> None:
        if copy.done:
            return
        if self.replicas == 2 and self.layout.epoch > pending.epoch and self.broken != "reroute-one-copy":
            # Routed by an older layout: every copy goes again, to the new holders, whatever the old ones
            # answered (see the module docstring); answers to the older copies are ignored from now on.
            pending.epoch = self.layout.epoch
            pending.generation += 1
            for each in pending.copies:
                each.applied_by, each.skipped = None, False
            for each in pending.copies:
                self._send(key, pending, each)
            return
        copy.attempt += 1
        attempt = copy.attempt
        target = self.layout.holders(pending.op.root, self.replicas)[copy.role]
        acker = self.ackers[target]
        if not acker.reachable:
            other = pending.copies[1 - copy.role] if self.replicas == 2 else None
            if other is not None and self._may_skip(pending, copy, other):
                copy.skipped = True  # the live replica has it (reason "replica")
                self.skipped += 1
                self._close_if_done(key, pending)
                return
            self.world.at(RETRY_SECONDS, self._send, key, pending, copy)
            return

        buffer = self._buffers.setdefault(target, [])
        if not buffer:
            self.world.at(FLUSH_SECONDS, self._flush, target)
        buffer.append((key, pending, copy, attempt, self.layout.epoch, pending.generation))
        self.world.at(RETRY_SECONDS, self._timeout, key, pending, copy, attempt)

    def _flush(self, target: int) -> None:
        """Send what is buffered for ``target`` as one batch; its answer settles every copy in it."""
        batch = [item for item in self._buffers.pop(target, []) if not item[2].done]
        if not batch:
            return

        def answer(status: str, layout: Layout, incarnation: int) -> None:
            for key, pending, copy, attempt, epoch, generation in batch:
                if generation == pending.generation:
                    self._answer(key, pending, copy, attempt, target, status, layout, incarnation, epoch)

        ops = [item[1].op for item in batch]
        self.world.send(self.ackers[target].receive_batch, ops, answer, [item[4] for item in batch])

    def _may_skip(self, pending: _Pending, copy: _Copy, other: _Copy) -> bool:
        """Whether a copy for a down replica may be skipped: only once the other copy is applied by a live one."""
        if self.broken == "client-skip":
            # Wrong on purpose (today's real client): skip while the other replica is merely reachable.
            holder = self.layout.holders(pending.op.root, self.replicas)[other.role]
            return self.ackers[holder].up
        return self._alive(other.applied_by)

    def _timeout(self, key: int, pending: _Pending, copy: _Copy, attempt: int) -> None:
        if not copy.done and copy.attempt == attempt:
            self._send(key, pending, copy)

    def _answer(
        self,
        key: int,
        pending: _Pending,
        copy: _Copy,
        attempt: int,
        target: int,
        status: str,
        layout: Layout,
        inc: int,
        epoch: int,
    ) -> None:
        if copy.done:
            return
        if status == "ok":
            copy.applied_by = (target, inc)
            self._close_if_done(key, pending)
            return
        if attempt != copy.attempt:
            return  # an older attempt's refusal: the newer attempt is already on its way
        if status == HELD_FULL:
            other = pending.copies[1 - copy.role] if self.replicas == 2 else None
            if self.broken == "bound-skip" and other is not None and self._alive(other.applied_by):
                # Wrong on purpose: skipped as if the acker were unreachable, though it will need the update.
                copy.skipped = True
                self.skipped += 1
                self._close_if_done(key, pending)
                return
            self.world.at(RETRY_SECONDS, self._send, key, pending, copy)
            return
        if layout.epoch > self.layout.epoch:
            self.layout = layout
            self.world.log(f"client adopts layout epoch {layout.epoch} {layout.ackers}")
        if layout.epoch > epoch:
            self._send(key, pending, copy)  # by the newer layout (two replicas: every copy, see _send)
        else:
            self.world.at(RETRY_SECONDS, self._send, key, pending, copy)

    def _close_if_done(self, key: int, pending: _Pending) -> None:
        if all(c.done for c in pending.copies):
            self._open.pop(key, None)

    def acker_down(self, ident: int) -> None:
        """An acker's connection broke: re-send its copies of operations whose other copy is not applied yet."""
        if self.replicas != 2 or self.broken == "client-skip":
            return
        for key, pending in list(self._open.items()):
            for copy in pending.copies:
                other = pending.copies[1 - copy.role]
                if copy.applied_by is not None and copy.applied_by[0] == ident and not self._alive(copy.applied_by):
                    if not other.done:
                        copy.applied_by = None
                        self._send(key, pending, copy)
