"""Spout: starts tuple trees, one or many at a time, keeps the backstop, and reports each emit's outcome exactly once.

Outcomes reach the user per record (``on_ack`` / ``on_fail``, Storm's API) or
per batch (``on_outcomes(acked, failed)``); either way they are settled a
batch at a time: one lock round per batch of outcomes the acker streams, one
queue item per batch for the callback thread. The pending map itself is in
:mod:`acker_client.pending`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
from acker_protocol.wire import Outcome

from .columns import random_ids, shard_slices
from .errors import AckerError, SpoutFull
from .ids import new_id
from .pending import PendingTrees, cluster_backstop, default_backstop
from .replica_outcomes import ReplicaOutcomes
from .settling import Settlement, SpoutStats
from .subscription import OutcomeSubscription
from .tuples import MessageId, TrackedTuple

__all__ = ["Spout", "SpoutStats", "OnOutcomes", "default_backstop"]

OnOutcomes = Callable[[list[Any], list[tuple[Any, Outcome]]], None]
"""``on_outcomes(acked, failed)``: ``acked`` lists the message ids of records whose tree completed,
``failed`` holds ``(message_id, reason)`` pairs, ``reason`` being FAILED, TIMED_OUT, LIFETIME_EXCEEDED or LOST."""

log = logging.getLogger(__name__)


_TIMEOUT_RESET = int(Outcome.TIMEOUT_RESET)
# Outcomes an acker sends that end a tree (LOST is the spout's own verdict, never an acker's): a range of
# codes, so telling them apart costs two comparisons per batch (np.isin costs microseconds on small batches).
_FIRST_END, _LAST_END = int(Outcome.ACKED), int(Outcome.TIMED_OUT)
assert {Outcome.ACKED, Outcome.FAILED, Outcome.TIMED_OUT} == {Outcome(c) for c in range(_FIRST_END, _LAST_END + 1)}
# The one end outside that range, checked only in batches that hold something other than the range.
_LIFETIME_EXCEEDED = int(Outcome.LIFETIME_EXCEEDED)


class Spout:
    """Starts one tuple tree per emitted record and reports each record's fate exactly once.

    Give either ``on_ack(message_id)`` and ``on_fail(message_id, reason)``
    (one call per record, Storm's API) or ``on_outcomes(acked, failed)`` (one
    call per batch of outcomes: ``acked`` is a list of message ids, ``failed``
    a list of ``(message_id, reason)`` pairs). Callbacks run on one background
    thread, one call at a time; within one batch of outcomes the acks come
    first. The spout subscribes to every acker's outcome stream; if an outcome
    never arrives (an acker died with its ledger, a shard was unreachable),
    its own backstop timeout fails the record with
    :attr:`Outcome.LOST <acker_protocol.wire.Outcome.LOST>`. ``reason`` is the
    :class:`~acker_protocol.wire.Outcome`: FAILED (a tuple was failed),
    TIMED_OUT (the acker's timeout), LIFETIME_EXCEEDED (the acker's lifetime
    cap: a tree kept alive that long still did not finish) or LOST.

    The backstop restarts when an acker reports that a tree's timeout was
    reset. It counts time per shard, and stands still while that shard's
    outcome stream is broken (for at most ``timeout`` seconds per outage): an
    acker keeps the outcomes it produced during a network blip and delivers
    them on resume, so the record gets the acker's outcome (ACKED, FAILED,
    TIMED_OUT), not LOST.

    With a replicated cluster (``--replicas 2``) both ackers that keep a tree
    report it: the first outcome settles the record, the second is counted in
    ``stats.duplicate_outcomes`` and ignored. A tree's backstop then stands
    still only while both its replicas' streams are down, and an init counts
    as undelivered only when both replicas missed it.

    Records are emitted one at a time (:meth:`emit`, :meth:`try_emit`,
    :meth:`emit_to`) or a batch at a time (:meth:`emit_many`,
    :meth:`try_emit_many`, :meth:`emit_columns`): one draw of random ids, one
    admission under ``max_pending`` and one ``init_columns`` call per batch.
    """

    def __init__(
        self,
        cluster,
        *,
        on_ack: Callable[[Any], None] | None = None,
        on_fail: Callable[[Any, Outcome], None] | None = None,
        on_outcomes: OnOutcomes | None = None,
        name: str | None = None,
        max_pending: int = 10_000,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        check_interval: float | None = None,
    ) -> None:
        if on_outcomes is None and (on_ack is None or on_fail is None):
            raise ValueError("give on_ack and on_fail (a call per record), or on_outcomes (a call per batch)")
        if on_outcomes is not None and (on_ack is not None or on_fail is not None):
            raise ValueError("give on_ack and on_fail, or on_outcomes, not both: each record gets exactly one callback")
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.cluster = cluster
        self.on_ack = on_ack
        self.on_fail = on_fail
        self.on_outcomes = on_outcomes
        self.name = name or f"spout-{socket.gethostname()}-{os.getpid()}-{new_id():016x}"
        self.max_pending = max_pending
        self.timeout = timeout if timeout is not None else self._default_timeout()
        self._clock = clock
        self._check_interval = check_interval or min(1.0, max(self.timeout / 10, 0.05))
        replicas = getattr(cluster, "replicas", 1)
        self._pending = PendingTrees(cluster.shard_count, self.timeout, replicas)
        self._settlement = Settlement(
            self.name, self._pending, clock, self._call_back, ReplicaOutcomes(replicas, self.timeout)
        )
        self._cond = self._settlement.cond  # guards the pending map and the counts
        self._counts = self._settlement.counts
        self._subscriptions: list[OutcomeSubscription] = []
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._started = False
        self._closed = False

    def _default_timeout(self) -> float:
        return cluster_backstop(self.cluster)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> Spout:
        """Subscribe to every acker and start the backstop and callback threads (idempotent)."""
        with self._cond:
            if self._started:
                return self
            if self._closed:
                raise AckerError("this spout is closed")
            self._started = True
        self.cluster.add_error_listener(self._on_batch_error)
        for shard in range(self.cluster.shard_count):
            sub = OutcomeSubscription(
                self.cluster,
                shard,
                self.name,
                deliver_batch=partial(self._from_acker, shard),
                on_dropped=self._on_dropped,
                on_state=self._on_stream_state,
            )
            self._subscriptions.append(sub.start())
        add_layout_listener = getattr(self.cluster, "add_layout_listener", None)
        if add_layout_listener is not None:
            add_layout_listener(self._follow_layout)
        self._threads.append(self._settlement.start())
        backstop = threading.Thread(target=self._backstop_loop, name="acker-spout-backstop", daemon=True)
        backstop.start()
        self._threads.append(backstop)
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop; records still pending are failed as LOST so that every emit gets its one callback."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            started = self._started
            self._cond.notify_all()  # an emit waiting for room gives up
        if not started:
            return
        self._stopping.set()
        for sub in self._subscriptions:
            sub.close(timeout)
        self.cluster.remove_error_listener(self._on_batch_error)
        self._settlement.lose_all()
        self._settlement.stop()
        for thread in self._threads:
            thread.join(timeout)

    def __enter__(self) -> Spout:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def subscriptions(self) -> tuple[OutcomeSubscription, ...]:
        """The per-shard outcome streams (for monitoring and tests)."""
        return tuple(self._subscriptions)

    # -- emitting one --------------------------------------------------------

    def emit(self, record: Any, message_id: Any, *, block: bool = True, timeout: float | None = None) -> TrackedTuple:
        """Start a tree for ``record`` and return the tracked tuple to send on; SpoutFull if still full after ``timeout``."""
        return self._emit(record, message_id, 1, block, timeout)[0]

    def try_emit(self, record: Any, message_id: Any) -> TrackedTuple | None:
        """Like :meth:`emit`, but return None at once when ``max_pending`` trees are in flight."""
        try:
            return self._emit(record, message_id, 1, False, None)[0]
        except SpoutFull:
            return None

    def emit_to(
        self, record: Any, message_id: Any, targets: int, *, block: bool = True, timeout: float | None = None
    ) -> list[TrackedTuple]:
        """Start one tree whose record goes to ``targets`` consumers: one tracked tuple (edge) per target."""
        if targets < 1:
            raise ValueError("targets must be at least 1")
        return self._emit(record, message_id, targets, block, timeout)

    def _emit(
        self, record: Any, message_id: Any, targets: int, block: bool, timeout: float | None
    ) -> list[TrackedTuple]:
        if not self._started:
            self.start()
        root = new_id()
        edges = [new_id() for _ in range(targets)]
        value = 0
        for edge in edges:
            value ^= edge
        # The timeout also bounds the wait for room in the client's buffer of the root's shard (see
        # ClusterClient.init_within); None: as long as the shard's back-pressure lasts. Real time, not
        # self._clock: these waits are real ones, which a test's manual clock would never run down.
        budget = timeout if block else 0.0
        give_up_at = None if budget is None else time.monotonic() + budget
        with self._cond:
            self._wait_for_room(1, block, timeout)
            self._pending.add(root, message_id, self._clock())
            self._counts["emitted"] += 1
        buffered = True
        try:
            if give_up_at is None:
                self.cluster.init(root, value, self.name)
            else:
                buffered = self.cluster.init_within(root, value, self.name, give_up_at - time.monotonic())
        except AckerError as exc:
            # The batch holding this init was dropped; the error listener has
            # already failed its roots as LOST, so the caller sees no exception.
            log.debug("init of root %d not delivered: %s", root, exc)
        if not buffered:
            self._withdraw([root])
            raise SpoutFull(f"the client's buffer for the acker of spout {self.name!r} stayed full for {budget} s")
        return [TrackedTuple(record, MessageId.single(root, edge)) for edge in edges]

    def _withdraw(self, roots: list[int]) -> None:
        """Forget roots whose inits were never buffered (the caller gets SpoutFull): no outcome will come for them."""
        with self._cond:
            for root in roots:
                self._pending.pop(root)
            self._counts["emitted"] -= len(roots)
            self._cond.notify_all()

    def _wait_for_room(self, count: int, block: bool, timeout: float | None) -> None:
        """With the lock held: return once ``count`` more trees fit under ``max_pending``, else SpoutFull."""
        if self._closed:
            raise AckerError("this spout is closed")
        if len(self._pending) + count <= self.max_pending:
            return
        if not block:
            raise SpoutFull(f"{self.max_pending} records pending in spout {self.name!r}")
        room = self.max_pending - count
        if not self._cond.wait_for(lambda: self._closed or len(self._pending) <= room, timeout):
            raise SpoutFull(f"{self.max_pending} records still pending in spout {self.name!r} after {timeout} s")
        if self._closed:
            raise AckerError("this spout is closed")

    # -- emitting in bulk ------------------------------------------------------

    def emit_many(
        self,
        records: Sequence[Any],
        message_ids: Sequence[Any],
        *,
        block: bool = True,
        timeout: float | None = None,
    ) -> list[TrackedTuple]:
        """Start one tree per record, all or none; the tracked tuples in order (``message_ids[i]`` is record i's).

        Waits (``block``) up to ``timeout`` seconds until every record fits
        under ``max_pending``, then raises SpoutFull having emitted nothing.
        ValueError if the lengths differ or the batch is larger than
        ``max_pending`` (it could never fit).
        """
        records, ids = _as_list(records), _as_list(message_ids)
        if len(records) != len(ids):
            raise ValueError(f"{len(records)} records but {len(ids)} message ids: give one message id per record")
        roots, edges = self._emit_columns(ids, block, timeout, prefix=False)
        return _tracked(records, roots, edges)

    def try_emit_many(self, records: Sequence[Any], message_ids: Sequence[Any]) -> list[TrackedTuple]:
        """Emit as many of ``records`` as fit under ``max_pending`` now, never waiting: the tuples of that prefix.

        ``records[len(result):]`` were not emitted (an empty list: the spout is full).
        """
        records, ids = _as_list(records), _as_list(message_ids)
        if len(records) != len(ids):
            raise ValueError(f"{len(records)} records but {len(ids)} message ids: give one message id per record")
        roots, edges = self._emit_columns(ids, False, None, prefix=True)
        return _tracked(records, roots, edges)

    def emit_columns(
        self, message_ids: Sequence[Any], *, block: bool = True, timeout: float | None = None, prefix: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Start one tree per message id and return ``(roots, edges)``: uint64 arrays, no tuple objects.

        Record i's spout tuple has MessageId ``{roots[i]: edges[i]}`` (what a
        columnar bolt or a load generator acks). All or none as in
        :meth:`emit_many`; with ``prefix=True`` it never waits and emits the
        longest prefix that fits now (the arrays' length says how many).
        """
        return self._emit_columns(_as_list(message_ids), block and not prefix, timeout, prefix=prefix)

    def _emit_columns(
        self, message_ids: list[Any], block: bool, timeout: float | None, *, prefix: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        if not self._started:
            self.start()
        count = len(message_ids)
        if count > self.max_pending and not prefix:
            raise ValueError(f"cannot emit {count} records at once with max_pending={self.max_pending}")
        ids = random_ids(2 * count)  # drawn before taking the lock: one urandom read for roots and edges
        roots, edges = ids[:count], ids[count:]
        # The timeout also bounds the wait for the client's buffers, as in _emit. A prefix emit keeps the
        # buffers' plain back-pressure: the replaying spout takes an empty prefix for "no room until an outcome".
        budget = timeout if block else 0.0
        give_up_at = None if budget is None or prefix else time.monotonic() + budget
        with self._cond:
            if prefix:
                if self._closed:
                    raise AckerError("this spout is closed")
                count = max(0, min(count, self.max_pending - len(self._pending)))
                roots, edges, message_ids = roots[:count], edges[:count], message_ids[:count]
            else:
                self._wait_for_room(count, block, timeout)
            if count:
                self._pending.add_many(roots, message_ids, self._clock())
                self._counts["emitted"] += count
        buffered = True
        if count:
            try:
                if give_up_at is None:
                    self.cluster.init_columns(roots, edges, self.name)
                else:
                    buffered = self.cluster.init_columns_within(roots, edges, self.name, give_up_at - time.monotonic())
            except AckerError as exc:
                # As in _emit: the error listener has failed the dropped inits as LOST.
                log.debug("inits of %d roots not delivered: %s", count, exc)
        if not buffered:
            self._withdraw(roots.tolist())
            raise SpoutFull(f"the client's buffers for the ackers of spout {self.name!r} stayed full for {budget} s")
        return roots, edges

    # -- outcomes ------------------------------------------------------------

    def _on_outcomes(self, shard: int, roots: np.ndarray, outcomes: np.ndarray, latency_micros: np.ndarray) -> None:
        """One batch streamed by ``shard``'s acker: restart the backstops it asks for, settle the trees it ended."""
        ends = (outcomes >= _FIRST_END) & (outcomes <= _LAST_END)
        if not ends.all():
            ends |= outcomes == _LIFETIME_EXCEEDED
            resets = outcomes == _TIMEOUT_RESET
            # Before the ends: an acker never reports a reset after the end of the same tree.
            if resets.any():
                self._settlement.restart(shard, roots[resets].tolist())
            unknown = ~(ends | resets)
            if unknown.any():
                # From a newer acker, or LOST (the spout's own verdict, never an acker's).
                log.warning("ignoring %d outcomes of unknown kinds %s", unknown.sum(), np.unique(outcomes[unknown]))
            roots, outcomes = roots[ends], outcomes[ends]
        if roots.size:
            self._settlement.ends(shard, roots.tolist(), outcomes)

    def _from_acker(self, shard: int, roots: np.ndarray, outcomes: np.ndarray, latency_micros: np.ndarray) -> None:
        """Outcomes from the acker that was ``shard`` when the spout started; after a layout change, from any acker.

        The pending map keeps the shard count the spout started with: once the ackers
        moved to another layout (a reshard or a drain), an acker's outcomes are settled in the
        tables of their roots, whichever acker reports them.
        """
        if not getattr(self.cluster, "layout_epoch", 0):
            self._on_outcomes(shard, roots, outcomes, latency_micros)
            return
        for table, positions in shard_slices(roots, self._pending.shard_count):
            self._on_outcomes(table, roots[positions], outcomes[positions], latency_micros[positions])

    def _follow_layout(self, addresses: tuple[str, ...]) -> None:
        """Subscribe to the ackers a new layout adds (the streams of those it drops end when they stop)."""
        with self._cond:
            if self._closed:
                return
            followed = {sub.address for sub in self._subscriptions}
        for index, address in enumerate(addresses):
            if address in followed:
                continue
            sub = OutcomeSubscription(
                self.cluster,
                index,
                self.name,
                deliver_batch=partial(self._from_acker, index),
                on_dropped=self._on_dropped,
            )
            sub.address = address
            self._subscriptions.append(sub.start())

    def _on_stream_state(self, shard: int, connected: bool) -> None:
        """A shard's outcome stream broke (pause its backstop clock) or is open again (resume it)."""
        with self._cond:
            self._pending.set_stream_down(shard, not connected, self._clock())
            self._cond.notify_all()  # wait_streams_open

    def _on_dropped(self, count: int) -> None:
        with self._cond:
            self._counts["dropped"] += count
        log.warning("spout %r: %d outcomes were dropped by an acker; the backstop will fail them", self.name, count)

    def _on_batch_error(self, error: AckerError) -> None:
        # Inits that never reached an acker would wait for the backstop; fail them now
        # (with replicas 2, those that reached neither replica: Settlement.lose).
        self._settlement.lose(getattr(error, "init_roots", ()))

    def _call_back(self, acked: list[Any], failed: list[tuple[Any, Outcome]]) -> None:
        """Run the user's callbacks for one batch; their errors are logged, never stop the other records'."""
        if self.on_outcomes is not None:
            try:
                self.on_outcomes(acked, failed)
            except Exception:
                log.exception("spout %r: on_outcomes for %d records raised", self.name, len(acked) + len(failed))
            return
        on_ack, on_fail = self.on_ack, self.on_fail
        assert on_ack is not None and on_fail is not None
        for message_id in acked:
            try:
                on_ack(message_id)
            except Exception:  # the user's bug must not stop the other records' callbacks
                log.exception("spout %r: callback for %r raised", self.name, message_id)
        for message_id, reason in failed:
            try:
                on_fail(message_id, reason)
            except Exception:
                log.exception("spout %r: callback for %r raised", self.name, message_id)

    # -- backstop ------------------------------------------------------------

    def check_timeouts(self) -> int:
        """Fail as LOST every record pending longer than the backstop timeout; return how many."""
        return self._settlement.expire()

    def _backstop_loop(self) -> None:
        while not self._stopping.wait(self._check_interval):
            try:
                self.check_timeouts()
            except Exception:
                log.exception("spout %r: backstop check failed", self.name)

    # -- state ---------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Records emitted and not yet settled."""
        with self._cond:
            return len(self._pending)

    @property
    def stats(self) -> SpoutStats:
        """A consistent snapshot of the counts."""
        return self._settlement.stats(self._subscriptions, getattr(self.cluster, "stats", None))

    def wait_streams_open(self, timeout: float | None = None) -> bool:
        """Wait until the outcome stream of every acker the spout started with is open; False on timeout.

        A stream opens in the background after :meth:`start` (its own connection to
        the acker). Until it has opened once, its backstop runs as for an open stream:
        a record whose stream never opened before a network cut ends LOST at the
        backstop (and is replayed) rather than with the acker's own outcome. A
        readiness check, or a job that wants the acker's verdict through a cut right
        at its start, waits here first.
        """
        with self._cond:
            return self._cond.wait_for(self._streams_open, timeout)

    def _streams_open(self) -> bool:
        first = self._subscriptions[: self.cluster.shard_count]  # those of later layouts are not waited for
        return len(first) == self.cluster.shard_count and all(sub.connected for sub in first)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending and every callback has returned; False on timeout."""
        with self._cond:
            return self._cond.wait_for(self._settlement.idle, timeout)


def _as_list(values: Sequence[Any] | np.ndarray) -> list[Any]:
    """``values`` as a list (a numpy array's items as Python objects)."""
    if isinstance(values, list):
        return values
    if isinstance(values, np.ndarray):
        return values.tolist()
    return list(values)


def _tracked(records: list[Any], roots: np.ndarray, edges: np.ndarray) -> list[TrackedTuple]:
    """The spout tuples of emitted records (``roots`` may be shorter than ``records``: a prefix was emitted)."""
    # The ids were drawn here, non-zero and 64-bit: no need to check each one again.
    trusted = MessageId._trusted
    return [TrackedTuple(r, trusted({root: edge})) for r, root, edge in zip(records, roots.tolist(), edges.tolist())]
