"""ClusterClient: routes operations to acker shards, batches and folds them, and sends them with deadlines."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields

import grpc
from acker_protocol import grpc_options
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from acker_protocol.wire import MAX_ID, check_id, check_root, check_spout_name, shard_of

from .batching import OpBuffer
from .delivery import ConnectionMonitor, DeliveryPolicy, deliver
from .errors import (
    REFUSAL_CODES,
    AckerError,
    ClusterMisconfigured,
    RequestRefused,
    ShardFailure,
    ShardUnavailable,
    _BatchError,
)

__all__ = ["ClusterClient", "ClientStats"]

log = logging.getLogger(__name__)

# os.getpid() is a real system call (about 250 ns on our machines), too dear
# for every ack. Python runs this hook in the child of every os.fork(), which
# is how PySpark's daemon and multiprocessing's "fork" context create workers.
_pid = os.getpid()
# Guards the creation of a process's state. Replaced in a forked child: another
# thread of the parent may have held it at the moment of the fork.
_state_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _pid, _state_lock
    _pid = os.getpid()
    _state_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass
class ClientStats:
    """Counters of what this process's client did (a forked child starts from zero)."""

    calls: int = 0  # ack/init/fail/reset_timeout calls buffered
    batches_sent: int = 0
    operations_sent: int = 0
    operations_folded: int = 0  # calls merged into another operation of the same batch
    batches_failed: int = 0
    operations_dropped: int = 0  # operations of batches given up on (all reasons)
    background_errors: int = 0  # failures of age-based flushes (reported to on_error)
    applied: int = 0  # from ApplyResponse
    deduplicated: int = 0
    ignored: int = 0
    batches_retried: int = 0  # attempts repeated after a transient failure
    operations_retried: int = 0
    operations_waiting: int = 0  # now: in batches waiting for their shard's connection (a gauge)
    # Operations dropped, by reason: "refused", "timeout", "ambiguous" (acker_client.delivery).
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    # Each shard's connection as last seen: UNKNOWN, READY, WAITING (retrying) or UNREACHABLE.
    shard_states: tuple[str, ...] = ()

    def copy(self) -> ClientStats:
        """A snapshot."""
        snapshot = ClientStats(**{f.name: getattr(self, f.name) for f in fields(self)})
        snapshot.dropped_by_reason = dict(self.dropped_by_reason)
        return snapshot


class _Sending:
    """Batches taken out of the buffers and being sent; :meth:`ClusterClient.flush` waits for these."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: _BatchError | None = None


class _ProcessState:
    """Channels, stubs, buffers and the flusher thread of one process (never shared across a fork)."""

    def __init__(self, addresses: Sequence[str], options: list[tuple[str, int]]) -> None:
        self.pid = _pid
        self.channels = [grpc.insecure_channel(a, options=options) for a in addresses]
        self.stubs = [acker_pb2_grpc.AckerStub(c) for c in self.channels]
        self.connections = ConnectionMonitor(len(addresses))
        self.buffers = [OpBuffer() for _ in addresses]
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.flusher: threading.Thread | None = None
        # The flusher hands each shard's aged batch to one of these threads, so
        # that a shard waiting for its connection holds up no other shard.
        self.senders: ThreadPoolExecutor | None = None
        self.busy: set[int] = set()  # shards with a background send in progress
        self.closed = False
        self.sending: set[_Sending] = set()
        self.stats = ClientStats()


class ClusterClient:
    """A client of an ordered list of acker shards (position = shard index).

    Operations are buffered per shard and sent as one ``Apply`` per batch when
    the batch reaches ``batch_size`` operations (by the caller that filled it),
    when its oldest operation is ``flush_interval`` seconds old (by a background
    thread), or on :meth:`flush`. Thread-safe; fork-safe (a forked child gets
    its own channels, buffers and threads and never sends the parent's
    buffered operations).

    Through a network blip (see :mod:`acker_client.delivery` and
    ``docs/client.md``): every attempt waits for the shard's connection
    (``wait_for_ready``) for at most ``deadline`` seconds, and a batch is
    retried after transient failures for up to ``wait_for_shard`` seconds in
    all, because every batch is safe to repeat (each unkeyed ACK gets the
    batch's dedup key; ``batch_keys=False`` turns that off and with it the
    retrying of batches that hold unkeyed ACKs). A shard's buffer never holds
    more than ``batch_size`` operations: the caller that fills it sends it and
    waits, which is the back-pressure a bolt's ``ack`` and a spout's ``emit``
    feel while a shard is unreachable. After ``wait_for_shard`` seconds the
    batch is dropped and the caller gets :class:`ShardUnavailable`; the trees
    involved are left to the spout's backstop. ``reconnect_backoff`` is the
    channels' (initial, maximum) pause in seconds between connection attempts.

    ``on_error`` receives the error of every failed background flush.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        batch_size: int = 512,
        flush_interval: float = 0.002,
        deadline: float = 5.0,
        verify: bool = True,
        on_error: Callable[[AckerError], None] | None = None,
        wait_for_shard: float = 20.0,
        reconnect_backoff: tuple[float, float] = (
            grpc_options.INITIAL_RECONNECT_BACKOFF_MS / 1000,
            grpc_options.MAX_RECONNECT_BACKOFF_MS / 1000,
        ),
        batch_keys: bool = True,
    ) -> None:
        if isinstance(addresses, str):
            addresses = [a for a in addresses.split(",") if a]
        if not addresses:
            raise ValueError("a cluster needs at least one acker address")
        if batch_size < 1 or flush_interval <= 0 or deadline <= 0:
            raise ValueError("batch_size, flush_interval and deadline must be positive")
        if wait_for_shard < 0:
            raise ValueError(f"wait_for_shard must be 0 or more seconds, got {wait_for_shard}")
        initial_backoff, max_backoff = reconnect_backoff
        self._channel_options = grpc_options.client_options(
            initial_reconnect_backoff_ms=round(initial_backoff * 1000),
            max_reconnect_backoff_ms=round(max_backoff * 1000),
        )
        self._addresses = tuple(addresses)
        self._n = len(self._addresses)
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.deadline = deadline
        self.wait_for_shard = wait_for_shard
        self.batch_keys = batch_keys
        self._policy = DeliveryPolicy(attempt_deadline=deadline, wait_for_shard=wait_for_shard)
        self.on_error = on_error
        self._listeners: list[Callable[[AckerError], None]] = []
        self._proc: _ProcessState | None = None
        self._abandoned: list[_ProcessState] = []
        self._closed = False
        self._known_spouts: set[str] = set()
        if verify:
            try:
                self._verify()
            except BaseException:
                self.close()
                raise

    # -- introspection -------------------------------------------------------

    @property
    def addresses(self) -> tuple[str, ...]:
        """The acker addresses in shard order."""
        return self._addresses

    @property
    def shard_count(self) -> int:
        """The number of shards."""
        return self._n

    def shard_of(self, root: int) -> int:
        """The shard that owns ``root``."""
        return shard_of(root, self._n)

    @property
    def stats(self) -> ClientStats:
        """A snapshot of this process's counters."""
        st = self._state()
        with st.lock:
            snapshot = st.stats.copy()
            snapshot.calls += sum(b.added for b in st.buffers)
        snapshot.shard_states = st.connections.states()
        return snapshot

    def add_error_listener(self, listener: Callable[[AckerError], None]) -> None:
        """Call ``listener`` with every failed batch, foreground or background (the spout uses this)."""
        self._listeners.append(listener)

    def remove_error_listener(self, listener: Callable[[AckerError], None]) -> None:
        """Stop calling ``listener``."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    # -- per-process state ---------------------------------------------------

    def _state(self) -> _ProcessState:
        st = self._proc
        if st is not None and st.pid == _pid:
            return st
        return self._new_state()

    def _new_state(self) -> _ProcessState:
        with _state_lock:
            st = self._proc
            if st is not None and st.pid == _pid:
                return st
            if self._closed:
                raise AckerError("this ClusterClient is closed")
            if st is not None:
                # The parent's channels belong to the parent: keep a reference
                # so that garbage collection never runs their finalizers here.
                self._abandoned.append(st)
            st = _ProcessState(self._addresses, self._channel_options)
            self._proc = st
            return st

    def _stub(self, shard: int) -> acker_pb2_grpc.AckerStub:
        return self._state().stubs[shard]

    # -- verification --------------------------------------------------------

    def describe(self, shard: int) -> acker_pb2.DescribeResponse:
        """The shard's Describe response; raises ShardUnavailable if it cannot be reached."""
        try:
            return self._stub(shard).Describe(acker_pb2.DescribeRequest(), timeout=self.deadline)
        except grpc.RpcError as exc:
            raise self._error([self._failure(shard, exc, 0, ())]) from exc

    def _verify(self) -> None:
        for shard, address in enumerate(self._addresses):
            info = self.describe(shard)
            if info.shard_count != self._n or info.shard_index != shard:
                raise ClusterMisconfigured(
                    f"address {shard} ({address}) is acker shard {info.shard_index} of {info.shard_count}, "
                    f"but the client was given {self._n} addresses with it at position {shard}; list every "
                    f"acker exactly once, in shard order (shard i at position i)"
                )
            if info.max_batch and self.batch_size > info.max_batch:
                raise ClusterMisconfigured(
                    f"batch_size {self.batch_size} exceeds shard {shard}'s ({address}) maximum batch of "
                    f"{info.max_batch} operations; lower batch_size"
                )

    # -- operations ----------------------------------------------------------

    def init(self, root: int, value: int, spout: str) -> None:
        """Buffer INIT: start tree ``root`` with checksum ``value`` (xor of its first edges), owned by ``spout``."""
        check_id(root, value)
        if spout not in self._known_spouts:
            check_spout_name(spout)
            self._known_spouts.add(spout)
        st, shard = self._state(), root % self._n
        with st.lock:
            buf = st.buffers[shard]
            buf.init(root, value, spout)
            full = self._after_add(st, shard, buf)
        if full is not None:
            self._send_now(st, *full)

    def ack(self, root: int, value: int, dedup_key: int = 0) -> None:
        """Buffer ACK(root, value); acks with the same root and dedup key in one batch fold into one."""
        # The hot path: checks and the common case inlined (about 0.5 µs per call).
        if not (0 < root <= MAX_ID and 0 <= value <= MAX_ID and 0 <= dedup_key <= MAX_ID):
            check_id(root, value)
            raise ValueError(f"dedup key {dedup_key!r} is not a 64-bit unsigned integer")
        st = self._proc
        if st is None or st.pid != _pid:
            st = self._new_state()
        shard = root % self._n
        with st.lock:
            buf = st.buffers[shard]
            buf.ack(root, value, dedup_key)
            full = None
            if buf.started is None or buf.size >= self.batch_size:
                full = self._after_add(st, shard, buf)
        if full is not None:
            self._send_now(st, *full)

    def fail(self, root: int, dedup_key: int = 0) -> None:
        """Buffer FAIL(root). (FAIL is idempotent; the dedup key is accepted for symmetry and unused.)"""
        self._idempotent(root, OpBuffer.fail)

    def reset_timeout(self, root: int) -> None:
        """Buffer RESET_TIMEOUT(root): the pending tree gets a fresh message timeout."""
        self._idempotent(root, OpBuffer.reset_timeout)

    def _idempotent(self, root: int, add: Callable[[OpBuffer, int], None]) -> None:
        check_root(root)
        st, shard = self._state(), root % self._n
        with st.lock:
            buf = st.buffers[shard]
            add(buf, root)
            full = self._after_add(st, shard, buf)
        if full is not None:
            self._send_now(st, *full)

    def _after_add(self, st: _ProcessState, shard: int, buf: OpBuffer):
        # Called with st.lock held. Returns (batches, ticket) to send now if the buffer is full.
        if buf.started is None:
            buf.started = time.monotonic()
            self._ensure_flusher(st)
            st.wake.notify()
        if buf.size >= self.batch_size:
            return self._take(st, lambda b: b is buf)
        return None

    # -- sending -------------------------------------------------------------

    def flush(self) -> None:
        """Send everything buffered, to all shards in parallel, and wait for batches already being sent.

        Raises ShardUnavailable / RequestRefused naming every shard whose batch
        failed; when it returns, every operation buffered before the call was
        applied.
        """
        st = self._state()
        with st.lock:
            earlier = list(st.sending)
            batches, sending = self._take(st, lambda buf: True)
        own = self._send(st, batches, sending)
        failures = list(own.failures) if own is not None else []
        for other in earlier:
            # A batch another thread is sending cannot outlive its deadline.
            other.done.wait()
            if other.error is not None:
                failures.extend(other.error.failures)
        if own is not None:
            self._report(own, background=False)
        if failures:
            raise self._error(failures)

    def _take(self, st: _ProcessState, due: Callable[[OpBuffer], bool]) -> tuple[dict[int, OpBuffer], _Sending]:
        # Called with st.lock held: swap out the buffers selected by ``due`` and
        # register them as being sent, in the same critical section, so that a
        # concurrent flush() either sends them itself or waits for them.
        taken = {}
        for shard, buf in enumerate(st.buffers):
            if buf.started is not None and due(buf):
                taken[shard] = buf
                st.buffers[shard] = OpBuffer()
                st.stats.calls += buf.added
        sending = _Sending()
        if taken:
            st.sending.add(sending)
        return taken, sending

    def _send_now(self, st: _ProcessState, batches: dict[int, OpBuffer], sending: _Sending) -> None:
        error = self._send(st, batches, sending)
        if error is not None:
            self._report(error, background=False)
            raise error

    def _send(self, st: _ProcessState, batches: dict[int, OpBuffer], sending: _Sending) -> _BatchError | None:
        """Send one batch per shard in parallel; return the combined error, or None."""
        if not batches:
            return None
        try:
            sending.error = self._send_batches(st, batches)
        finally:
            with st.lock:
                st.sending.discard(sending)
            sending.done.set()
        return sending.error

    def _send_batches(self, st: _ProcessState, batches: dict[int, OpBuffer]) -> _BatchError | None:
        failures = deliver(
            st,
            batches,
            policy=self._policy,
            batch_keys=self.batch_keys,
            failure_of=self._failure,
            on_sent=self._count_sent,
        )
        if failures:
            with st.lock:
                st.stats.batches_failed += len(failures)
                st.stats.operations_dropped += sum(f.operations for f in failures)
                for f in failures:
                    by_reason = st.stats.dropped_by_reason
                    by_reason[f.reason] = by_reason.get(f.reason, 0) + f.operations
            return self._error(failures)
        return None

    def _count_sent(self, st: _ProcessState, buf: OpBuffer, count: int, response: acker_pb2.ApplyResponse) -> None:
        with st.lock:
            s = st.stats
            s.batches_sent += 1
            s.operations_sent += count
            s.operations_folded += buf.added - count
            s.applied += response.applied
            s.deduplicated += response.deduplicated
            s.ignored += response.ignored

    def _failure(self, shard: int, exc: grpc.RpcError, count: int, init_roots: tuple[int, ...]) -> ShardFailure:
        code = exc.code() if hasattr(exc, "code") else None
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        return ShardFailure(shard, self._addresses[shard], code, detail or "", count, init_roots)

    @staticmethod
    def _error(failures: list[ShardFailure]) -> _BatchError:
        refused = [f for f in failures if f.code in REFUSAL_CODES]
        if refused:
            return RequestRefused(failures, "an acker refused a batch; nothing of that batch was applied")
        return ShardUnavailable(failures, "acker shard unavailable; its operations were dropped")

    def _report(self, error: AckerError, *, background: bool) -> None:
        for listener in list(self._listeners):
            try:
                listener(error)
            except Exception:  # a listener's bug must not stop the others or the flusher
                log.exception("acker client error listener failed")
        if background:
            log.warning("background flush failed: %s", error)
            if self.on_error is not None:
                try:
                    self.on_error(error)
                except Exception:
                    log.exception("acker client on_error callback failed")

    # -- background flusher --------------------------------------------------

    def _ensure_flusher(self, st: _ProcessState) -> None:
        # Called with st.lock held.
        if st.flusher is None and not st.closed:
            st.flusher = threading.Thread(target=self._flush_loop, args=(st,), name="acker-client-flusher", daemon=True)
            st.flusher.start()

    def _flush_loop(self, st: _ProcessState) -> None:
        interval = self.flush_interval
        while True:
            with st.lock:
                if st.closed:
                    return
                now = time.monotonic()
                started = False
                for shard, buf in enumerate(st.buffers):
                    # A shard whose last aged batch is still waiting for its
                    # connection is skipped: its buffer fills up to batch_size,
                    # and the caller that fills it waits (back-pressure).
                    if shard in st.busy or buf.started is None or now - buf.started < interval:
                        continue
                    batches, sending = self._take(st, lambda b: b is buf)  # noqa: B023
                    st.busy.add(shard)
                    if st.senders is None:
                        st.senders = ThreadPoolExecutor(self._n, thread_name_prefix="acker-client-sender")
                    st.senders.submit(self._background_send, st, shard, batches, sending)
                    started = True
                if not started:
                    starts = [b.started for i, b in enumerate(st.buffers) if b.started is not None and i not in st.busy]
                    st.wake.wait(min(starts) + interval - now if starts else None)

    def _background_send(self, st: _ProcessState, shard: int, batches: dict[int, OpBuffer], sending: _Sending) -> None:
        try:
            error = self._send(st, batches, sending)
        finally:
            with st.lock:
                st.busy.discard(shard)
                st.wake.notify_all()
        if error is not None:
            with st.lock:
                st.stats.background_errors += 1
            self._report(error, background=True)

    # -- subscriptions -------------------------------------------------------

    def subscribe(
        self,
        shard: int,
        spout: str,
        incarnation: int = 0,
        after_sequence: int = 0,
        timeout: float | None = None,
    ):
        """Open the outcome stream of ``spout`` on ``shard``: an iterator of OutcomeBatch with ``cancel()``.

        The call waits for the shard's connection (``wait_for_ready``), so a
        stream re-opened during a blip starts the moment the network is back.
        """
        request = acker_pb2.SubscribeRequest(spout=spout, incarnation=incarnation, after_sequence=after_sequence)
        return self._stub(shard).Subscribe(request, timeout=timeout, wait_for_ready=True)

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Flush what is buffered (errors are reported, not raised), stop the flusher and close the channels."""
        st = self._proc
        if st is None or st.pid != _pid or st.closed:
            self._closed = True
            return
        try:
            self.flush()
        except AckerError as exc:
            log.warning("final flush on close failed: %s", exc)
        with st.lock:
            st.closed = True
            st.wake.notify_all()
        if st.flusher is not None and st.flusher is not threading.current_thread():
            st.flusher.join(timeout=self.deadline + 1.0)
        if st.senders is not None:
            st.senders.shutdown(wait=True)
        for channel in st.channels:
            channel.close()
        self._closed = True
        self._proc = None

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ClusterClient({list(self._addresses)!r})"
