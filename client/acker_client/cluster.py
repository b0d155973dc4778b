"""ClusterClient: the public API of the acker cluster, routing each operation to its shard's buffer.

The per-process state (channels, buffers, counters) is in :mod:`.process`, the
sending and the age-based flusher in :mod:`.sender`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import grpc
import numpy as np
from acker_protocol import grpc_options
from acker_protocol.credentials import ChannelSecurity
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from acker_protocol.wire import MAX_ID, check_id, check_replicas, check_root, check_spout_name, replica_shards, shard_of

from . import process
from .batching import ACK, FAIL, INIT, RESET_TIMEOUT, OpBuffer
from .columns import as_ids, as_roots, distinct, fold_xor, replica_slices
from .errors import AckerError, ClusterMisconfigured, batch_error, connect_error, shard_failure
from .ids import new_id
from .process import ClientStats, ProcessState
from .relayout import send_until_applied, split_request, with_layout_epoch
from .sender import Sender, undelivered

__all__ = ["ClusterClient", "ClientStats", "check_address"]

log = logging.getLogger(__name__)


def check_address(address: str) -> None:
    """Raise ValueError unless ``address`` is ``host:port`` (or a gRPC target with a scheme, such as ``unix:``).

    gRPC reads a bare host as port 443: an acker address without its port would
    silently point at the wrong service.
    """
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"acker address {address!r} is empty; write host:port, e.g. 127.0.0.1:7100")
    if address.startswith("unix:") or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or host.endswith(":") or (":" in host and not host.startswith("[")):
        raise ValueError(f"acker address {address!r} has no port; write host:port, e.g. {address}:7100")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"acker address {address!r} has no valid port (1-65535); write host:port")


class ClusterClient:
    """A client of an ordered list of acker shards (position = shard index).

    Operations are buffered per shard and sent as one batch: by a background
    thread at once when the shard has no batch in flight (adaptive linger:
    while one is, the next grows, for at most ``flush_interval`` seconds), by
    the caller that fills it to ``batch_size`` operations, or on :meth:`flush`.
    Batches go over one long-lived ``ApplyStream`` per shard (see
    :mod:`acker_client.apply_stream`), or one ``Apply`` call each to an acker
    that does not offer the stream (its Describe says so) or when
    ``apply_stream`` is False. ``send_when_idle=False`` makes every buffer wait
    its full ``flush_interval`` instead (the fixed linger of earlier versions). Thread-safe; fork-safe (a forked child gets
    its own channels, buffers and threads and never sends the parent's
    buffered operations).

    Through a network blip (see :mod:`acker_client.delivery` and
    ``docs/client-outages.md``): every attempt waits for the shard's connection
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

    With a replication factor of 2 (the ackers' ``--replicas``, read from
    Describe; ``replicas`` may state what the caller expects) every operation
    is buffered for both shards that keep its tree, ``root % n`` and the next
    one, and each copy is batched, keyed and retried on its own. A replica that
    cannot be reached while its partners can is skipped (its batch dropped with
    reason ``replica``, never raised): an operation is delivered once every
    live replica applied it, and one acker's outage blocks no caller.

    ``on_error`` receives the error of every failed background flush.
    ``security`` gives TLS / mTLS files and a bearer token
    (:class:`acker_protocol.credentials.ChannelSecurity`); None is plaintext.
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
        security: ChannelSecurity | None = None,
        column_batch_size: int = 16_384,
        replicas: int | None = None,
        apply_stream: bool = True,
        send_when_idle: bool = True,
    ) -> None:
        if isinstance(addresses, str):
            addresses = [a for a in addresses.split(",") if a]
        if not addresses:
            raise ValueError("a cluster needs at least one acker address")
        for address in addresses:
            check_address(address)
        if batch_size < 1 or flush_interval <= 0 or deadline <= 0 or column_batch_size < 1:
            raise ValueError("batch_size, column_batch_size, flush_interval and deadline must be positive")
        if wait_for_shard < 0:
            raise ValueError(f"wait_for_shard must be 0 or more seconds, got {wait_for_shard}")
        initial_backoff, max_backoff = reconnect_backoff
        self._channel_options = grpc_options.client_options(
            initial_reconnect_backoff_ms=round(initial_backoff * 1000),
            max_reconnect_backoff_ms=round(max_backoff * 1000),
        )
        self._addresses = tuple(addresses)
        self.security = security
        self._n = len(self._addresses)
        self.batch_size = batch_size
        # Columns are sent in requests of up to this many operations: one Apply
        # per 512 operations would cost a column of 100,000 acks 200 round trips.
        self.column_batch_size = max(batch_size, column_batch_size)
        self.on_error = on_error
        self._sender = Sender(
            self._addresses,
            deadline=deadline,
            flush_interval=flush_interval,
            report=self._report,
            wait_for_shard=wait_for_shard,
            batch_keys=batch_keys,
            send_when_idle=send_when_idle,
        )
        self._listeners: list[Callable[[AckerError], None]] = []
        # The ackers' layout epoch this client routes by (0: as listed), and what follows a change (relayout.py).
        self._epoch = 0
        self._layout_lock = threading.Lock()
        self._layout_listeners: list[Callable[[tuple[str, ...]], None]] = []
        self._retired: list[ProcessState] = []  # states of earlier layouts: their last batches still re-route
        self._proc: ProcessState | None = None
        self._abandoned: list[ProcessState] = []
        self._closed = False
        self._known_spouts: set[str] = set()
        # Per shard: send over ApplyStream (until its Describe or an UNIMPLEMENTED answer says otherwise).
        self._streams = [apply_stream] * self._n
        # None: whatever the ackers say (1 without verification); checked against Describe in _verify.
        self._expected_replicas = replicas
        if replicas is not None:
            check_replicas(replicas, self._n)
        self._set_replicas(replicas or 1)
        # Unverified and not told: learn it on first use (_new_state), from any shard.
        self._learn_replicas = replicas is None and not verify
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
    def deadline(self) -> float:
        """Seconds every call to an acker may take."""
        return self._sender.deadline

    @deadline.setter
    def deadline(self, seconds: float) -> None:
        self._sender.deadline = seconds

    @property
    def wait_for_shard(self) -> float:
        """Seconds one batch may wait and retry for its shard before it is dropped."""
        return self._sender.wait_for_shard

    @property
    def batch_keys(self) -> bool:
        """Whether unkeyed ACKs get their batch's dedup key (so every batch may be retried)."""
        return self._sender.batch_keys

    @property
    def flush_interval(self) -> float:
        """Seconds after which a buffer's oldest operation is sent by the background flusher."""
        return self._sender.flush_interval

    @property
    def shard_count(self) -> int:
        """The number of shards."""
        return self._n

    def shard_of(self, root: int) -> int:
        """The shard that owns ``root``."""
        return shard_of(root, self._n)

    @property
    def replicas(self) -> int:
        """The cluster's replication factor: how many shards keep each tree (1 or 2)."""
        return self._replicas

    def replica_shards(self, root: int) -> tuple[int, ...]:
        """The shards that keep ``root``, its owner first."""
        return replica_shards(root, self._n, self._replicas)

    def _set_replicas(self, replicas: int) -> None:
        self._replicas = replicas
        self._sender.replicas = replicas

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

    def _state(self) -> ProcessState:
        st = self._proc
        if st is not None and st.pid == process.current_pid():
            return st
        return self._new_state()

    def _new_state(self) -> ProcessState:
        with process.state_lock:
            st = self._proc
            if st is not None and st.pid == process.current_pid():
                return st
            if self._closed:
                raise AckerError("this ClusterClient is closed")
            if st is not None:
                # The parent's channels belong to the parent: keep a reference
                # so that garbage collection never runs their finalizers here.
                self._abandoned.append(st)
            st = ProcessState(self._addresses, self._channel_options, self.security, self._streams)
            st.relayout = self._relayout
            st.epoch = self._epoch
            self._proc = st
            if self._learn_replicas:
                # Asked again by the next process state (a forked worker's) if no shard answered.
                self._learn_replicas = not self._replicas_from_any_shard(st)
            return st

    def _replicas_from_any_shard(self, st: ProcessState) -> bool:
        """Without verification, take the replication factor from the first shard that answers Describe.

        An unverified client (a Spark executor's) must still send every operation
        to both replicas of a replicated cluster; with no shard answering it keeps
        one replica, which is safe (a replica missing updates never acks falsely)
        but forgoes the second copy. The calls wait for a connection (a channel
        still connecting, or back from a blip, is given the deadline) rather than
        settling for one replica at the first refused connection. True if a
        shard answered.
        """
        answered: queue.SimpleQueue = queue.SimpleQueue()
        calls = [
            stub.Describe.future(acker_pb2.DescribeRequest(), timeout=self.deadline, wait_for_ready=True)
            for stub in st.stubs
        ]
        for call in calls:
            call.add_done_callback(answered.put)
        for _ in calls:  # in the order they answer: one dead shard does not hold up the others
            call = answered.get()
            if call.cancelled() or call.exception() is not None:
                continue
            factor = call.result().replicas or 1
            if factor <= self._n:
                self._set_replicas(factor)
            break
        else:
            log.warning("no acker answered Describe; sending every operation to one replica only")
            for call in calls:
                call.cancel()
            return False
        for call in calls:
            call.cancel()
        return True

    def _stub(self, shard: int) -> acker_pb2_grpc.AckerStub:
        return self._state().stubs[shard]

    # -- following a layout change: reshard, drain (see relayout.py) ---------

    @property
    def layout_epoch(self) -> int:
        """The ackers' layout epoch this client routes by (0: the addresses it was given)."""
        return self._epoch

    def add_layout_listener(self, listener: Callable[[tuple[str, ...]], None]) -> None:
        """Call ``listener(addresses)`` after the client adopted a new layout (subscribers follow new ackers with it)."""
        self._layout_listeners.append(listener)

    def _relayout(self, st: ProcessState, shard: int, request: bytes, depth: int = 0) -> bool:
        """A batch ``shard`` refused as not its own: adopt a newer layout from Describe and re-route it; False if none."""
        try:
            info = st.stubs[shard].Describe(acker_pb2.DescribeRequest(), timeout=self.deadline)
        except grpc.RpcError:
            return False
        # During a change the refusing acker names the layout being moved to: route by it now.
        moving = info.HasField("next_layout") and info.next_layout.epoch > info.layout.epoch
        layout = info.next_layout if moving else info.layout
        if not layout.addresses or depth > 3:
            return False
        new_state = self._adopt(layout.epoch, tuple(layout.addresses))
        if new_state is None:
            return False
        give_up_at = time.monotonic() + self.wait_for_shard
        # With two replicas every copy goes again, to both new keepers of each root, whatever the other old
        # keeper answered: the refusing keeper's copy went to one of them, which one this client does not know
        # (docs/acker-semantics.md, "Moving trees with two replicas"); a keeper that has it drops the repeat.
        parts = split_request(request, len(layout.addresses), self._replicas)
        for target, part in parts.items():
            part = with_layout_epoch(part, layout.epoch)
            call = new_state.apply_calls[target]

            def send(data: bytes, timeout: float, wait_for_ready: bool, call=call) -> object:
                response = call.future(data, timeout=timeout, wait_for_ready=wait_for_ready).result()
                with new_state.lock:  # counted as any batch's answer (a held part applies at the new owner later)
                    stats = new_state.stats
                    stats.applied += response.applied
                    stats.deduplicated += response.deduplicated
                    stats.ignored += response.ignored
                    stats.held += response.held
                return response

            if not self._send_part(new_state, target, part, send, give_up_at, depth):
                return False
        with new_state.lock:  # counted where stats are read: the current layout's state
            new_state.stats.batches_rerouted += 1
        return True

    def _send_part(
        self, st: ProcessState, target: int, part: bytes, send: Callable[..., object], give_up_at: float, depth: int
    ) -> bool:
        """Send one re-routed part until applied; whether it was (here, or re-routed again by a newer layout)."""
        pause = 0.05
        while True:
            error = send_until_applied(send, part, deadline=self.deadline, give_up_at=give_up_at, sleep=time.sleep)
            if error is None:
                return True
            if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                return False
            if self._relayout(st, target, part, depth + 1):
                return True  # the layout changed again meanwhile
            if time.monotonic() >= give_up_at:
                return False
            # The new owner does not know the layout yet (its step comes later): ask again shortly.
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _adopt(self, epoch: int, addresses: tuple[str, ...]) -> ProcessState | None:
        """Route by layout ``epoch`` from now on (a no-op if it is not newer); the state of the current layout."""
        with self._layout_lock:
            if epoch < self._epoch or (epoch == self._epoch and addresses == self._addresses):
                return self._state() if epoch == self._epoch else None
            for address in addresses:
                check_address(address)
            with process.state_lock:
                old = self._proc
                self._addresses = addresses
                self._n = len(addresses)
                self._streams = [all(self._streams)] * self._n
                self._sender.addresses = addresses
                self._epoch = epoch
                st = ProcessState(addresses, self._channel_options, self.security, self._streams)
                st.relayout = self._relayout
                st.epoch = epoch
                self._proc = st
                if old is not None:
                    # Its flusher still sends what was buffered there; the ackers refuse it and it re-routes here.
                    self._retired.append(old)
            log.info("acker layout epoch %d: routing to %d shards %s", epoch, len(addresses), ",".join(addresses))
        for listener in list(self._layout_listeners):
            try:
                listener(addresses)
            except Exception:
                log.exception("acker client layout listener failed")
        return st

    def subscribe_at(
        self, address: str, spout: str, incarnation: int = 0, after_sequence: int = 0, timeout: float | None = None
    ):
        """Open the outcome stream of ``spout`` on the acker at ``address`` (of the current or an earlier layout)."""
        request = acker_pb2.SubscribeRequest(spout=spout, incarnation=incarnation, after_sequence=after_sequence)
        for st in (self._state(), *reversed(self._retired)):
            if address in st.addresses:
                return st.subscribe_calls[st.addresses.index(address)](request, timeout=timeout, wait_for_ready=True)
        raise AckerError(f"{address} is not an acker of this client's layouts")

    # -- verification --------------------------------------------------------

    def describe(self, shard: int, *, wait: float | None = None) -> acker_pb2.DescribeResponse:
        """The shard's Describe response; raises ShardUnavailable if it cannot be reached.

        ``wait``: seconds to wait for a connection (a channel reconnecting after a
        blip is given that long to come back) instead of failing at once.
        """
        try:
            if wait is not None:
                return self._stub(shard).Describe(acker_pb2.DescribeRequest(), timeout=wait, wait_for_ready=True)
            return self._stub(shard).Describe(acker_pb2.DescribeRequest(), timeout=self.deadline)
        except grpc.RpcError as exc:
            raise batch_error([shard_failure(shard, self._addresses[shard], exc, 0)]) from exc

    def _verify(self) -> None:
        # Every shard at once, so a wrong address list names every dead shard, not only the first.
        calls = [
            self._stub(shard).Describe.future(acker_pb2.DescribeRequest(), timeout=self.deadline)
            for shard in range(self._n)
        ]
        infos, failures = [], []
        for shard, call in enumerate(calls):
            try:
                infos.append(call.result())
            except grpc.RpcError as exc:
                failures.append(shard_failure(shard, self._addresses[shard], exc, 0))
        if failures:
            raise connect_error(failures, self._n)
        self._check_replicas(infos)
        for shard, info in enumerate(infos):
            if not info.apply_stream and self._streams[shard]:
                # An acker older than ApplyStream: its batches go one Apply call each.
                self._streams[shard] = False
                self._state().apply_calls[shard].use_unary(f"acker {shard} ({self._addresses[shard]}) predates it")
        for shard, (address, info) in enumerate(zip(self._addresses, infos)):
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
            if info.max_batch:
                self.column_batch_size = min(self.column_batch_size, info.max_batch)

    def _check_replicas(self, infos: list[acker_pb2.DescribeResponse]) -> None:
        """Every acker must have the same replication factor (and the one the caller expects, if given)."""
        factors = [info.replicas or 1 for info in infos]  # 0: an acker older than replication, so 1
        if len(set(factors)) > 1:
            listing = ", ".join(f"shard {i} ({a}): {r}" for i, (a, r) in enumerate(zip(self._addresses, factors)))
            raise ClusterMisconfigured(
                f"the ackers disagree on the replication factor ({listing}); start every acker with the same --replicas"
            )
        factor = factors[0]
        if self._expected_replicas is not None and factor != self._expected_replicas:
            raise ClusterMisconfigured(
                f"the client expects replicas {self._expected_replicas} but the ackers run with --replicas {factor}"
            )
        self._set_replicas(factor)

    # -- operations ----------------------------------------------------------

    def init(self, root: int, value: int, spout: str) -> None:
        """Buffer INIT: start tree ``root`` with checksum ``value`` (xor of its first edges), owned by ``spout``."""
        # Once per tree: checks, the pid test and the shard inlined like ack's.
        if not (0 < root <= MAX_ID and 0 <= value <= MAX_ID):
            check_id(root, value)
        if spout not in self._known_spouts:  # _check_spout's test, inlined: once per tree
            self._check_spout(spout)
        st = self._proc
        if st is None or st.pid != process._pid:
            st = self._new_state()
        if self._replicas > 1:
            self._replicated(st, root, lambda buf: buf.init(root, value, spout))
            return
        shard = root % self._n
        with st.lock:
            buf = st.buffers[shard]
            buf.init(root, value, spout)
            full = None
            if buf.started is None or buf.size >= self.batch_size:
                full = self._after_add(st, shard, buf)
        if full is not None:
            self._sender.send_now(st, *full)

    def init_within(self, root: int, value: int, spout: str, timeout: float) -> bool:
        """Buffer INIT like :meth:`init`, waiting at most ``timeout`` seconds for room; False if none (nothing buffered).

        :meth:`init` lets the caller that fills a shard's buffer send it and
        wait for the shard, for up to ``wait_for_shard`` seconds while it is
        unreachable. Here a full buffer goes to a background sender instead,
        and only while that shard already has a batch on its way does a
        caller that would fill the buffer again wait, for the shard's batch
        to end or ``timeout`` to pass, whichever comes first: the spout's
        ``emit(timeout=...)`` and ``try_emit`` (``timeout=0``) keep their promise.
        """
        if not (0 < root <= MAX_ID and 0 <= value <= MAX_ID):
            check_id(root, value)
        self._check_spout(spout)
        # Every shard that keeps the tree (its replicas) gets the init, all or none.
        needs = [(shard, 1) for shard in replica_shards(root, self._n, self._replicas)]
        buffered = self._buffer_within(needs, lambda _, buf: buf.init(root, value, spout), timeout)
        if buffered is None:  # the buffer is as large as a request may be: the plain way sends it first
            self.init(root, value, spout)
        return buffered is not False

    def ack(self, root: int, value: int, dedup_key: int = 0) -> None:
        """Buffer ACK(root, value); acks with the same root and dedup key in one batch fold into one."""
        # The hot path (once per tuple acked): the checks and the common case are inlined, as every call here is paid per tuple.
        if not (0 < root <= MAX_ID and 0 <= value <= MAX_ID and 0 <= dedup_key <= MAX_ID):
            check_id(root, value)
            raise ValueError(f"dedup key {dedup_key!r} is not a 64-bit unsigned integer")
        st = self._proc
        if st is None or st.pid != process._pid:  # process.current_pid(), inlined on the hot path
            st = self._new_state()
        if self._replicas > 1:
            # Both copies carry one key, in every retry: a restarted replica that installs its
            # partner's snapshot then recognises the copy it holds as already applied.
            key = dedup_key or new_id()
            self._replicated(st, root, lambda buf: buf.ack(root, value, key))
            return
        shard = root % self._n  # shard_of, inlined
        with st.lock:
            buf = st.buffers[shard]
            if dedup_key:
                buf.ack(root, value, dedup_key)
            else:
                # OpBuffer.ack's unkeyed fold, inlined: this runs once per tuple acked.
                acks = buf._acks
                old = acks.get(root)
                if old is None:
                    acks[root] = value
                    buf.size += 1
                else:
                    acks[root] = old ^ value
                buf.added += 1
            full = None
            if buf.started is None or buf.size >= self.batch_size:
                full = self._after_add(st, shard, buf)
        if full is not None:
            self._sender.send_now(st, *full)

    def fail(self, root: int, dedup_key: int = 0) -> None:
        """Buffer FAIL(root). (FAIL is idempotent; the dedup key is accepted for symmetry and unused.)"""
        self._idempotent(root, OpBuffer.fail)

    def reset_timeout(self, root: int) -> None:
        """Buffer RESET_TIMEOUT(root): the pending tree gets a fresh message timeout."""
        self._idempotent(root, OpBuffer.reset_timeout)

    def _idempotent(self, root: int, add: Callable[[OpBuffer, int], None]) -> None:
        check_root(root)
        st, shard = self._state(), shard_of(root, self._n)
        if self._replicas > 1:
            self._replicated(st, root, lambda buf: add(buf, root))
            return
        with st.lock:
            buf = st.buffers[shard]
            add(buf, root)
            full = self._after_add(st, shard, buf)
        if full is not None:
            self._sender.send_now(st, *full)

    def _replicated(self, st: ProcessState, root: int, add: Callable[[OpBuffer], None]) -> None:
        """Buffer one operation for every shard that keeps ``root``; full buffers go out together."""
        owner = root % self._n
        shards = [(owner + k) % self._n for k in range(self._replicas)]
        full = None
        with st.lock:
            for shard in shards:
                buf = st.buffers[shard]
                add(buf)
                self._start_buffer(st, buf)
            if any(st.buffers[shard].size >= self.batch_size for shard in shards):
                full = self._sender.take(st, lambda b: b.size >= self.batch_size)
        if full is not None:
            self._sender.send_now(st, *full)

    def _after_add(self, st: ProcessState, shard: int, buf: OpBuffer):
        # Called with st.lock held. Returns (batches, ticket) to send now if the buffer is full.
        self._start_buffer(st, buf)
        if buf.size >= self.batch_size:
            return self._sender.take(st, lambda b: b is buf)
        return None

    def _start_buffer(self, st: ProcessState, buf: OpBuffer) -> None:
        """With ``st.lock`` held, after an add: date the buffer's first operation and wake the flusher to send it.

        The flusher sends it at once if its shard is idle, else when the batch in
        flight is answered or the buffer is ``flush_interval`` old. A buffer
        already started keeps its date: its age counts from its oldest operation.
        """
        if buf.started is not None:
            return
        buf.started = time.monotonic()
        self._sender.ensure_flusher(st)
        st.wake.notify()

    def _check_spout(self, spout: str) -> None:
        """Refuse a bad spout name (ValueError); a name is checked the first time it is used, not on every init."""
        if spout in self._known_spouts:
            return
        check_spout_name(spout)
        self._known_spouts.add(spout)

    # -- operations in columns ---------------------------------------------------

    def init_columns(self, roots: object, values: object, spout: str) -> None:
        """Buffer one INIT per root (``values[i]``: root i's first edges XORed), all owned by ``spout``.

        ``roots`` and ``values`` are equal-length uint64 arrays (anything
        ``numpy.asarray`` turns into unsigned integers). Buffered, batched,
        retried and back-pressured like :meth:`init`, without a Python object
        per operation.
        """
        roots_array, values_array = as_roots(roots), as_ids(values)
        _same_length(roots_array, values_array)
        self._check_spout(spout)
        self._add_columns(INIT, roots_array, values_array, spout=spout)

    def init_columns_within(self, roots: object, values: object, spout: str, timeout: float) -> bool:
        """:meth:`init_columns`, all or none, waiting at most ``timeout`` seconds for room; False: nothing buffered.

        As :meth:`init_within` for every shard the roots go to: full buffers go
        to background senders, and while a shard already has a batch on its way
        the call waits for it, or gives up at ``timeout``. A shard's share must
        fit in one request (``column_batch_size`` operations, with what its
        buffer holds); a larger one is buffered by :meth:`init_columns`, which
        waits as long as the back-pressure lasts.
        """
        roots_array, values_array = as_roots(roots), as_ids(values)
        _same_length(roots_array, values_array)
        self._check_spout(spout)
        # With replicas a shard may both own and follow some of the roots: one share per shard.
        slices: dict[int, np.ndarray] = {}
        for shard, positions in replica_slices(roots_array, self._n, self._replicas):
            slices[shard] = np.concatenate((slices[shard], positions)) if shard in slices else positions

        def add(shard: int, buf: OpBuffer) -> None:
            here = slices[shard]
            buf.add_columns(INIT, roots_array[here], values_array[here], spout=spout)

        buffered = self._buffer_within([(s, p.size) for s, p in slices.items()], add, timeout)
        if buffered is None:
            self._add_columns(INIT, roots_array, values_array, spout=spout)
        return buffered is not False

    def _buffer_within(
        self, needs: list[tuple[int, int]], add: Callable[[int, OpBuffer], None], timeout: float
    ) -> bool | None:
        """Give each ``(shard, operations)`` of ``needs`` room, all at once, within ``timeout``, and ``add`` them.

        True: added (full buffers handed to background senders); False: no room
        in time, nothing added; None: a shard's share would not fit in one request.
        """
        st = self._state()
        give_up_at = time.monotonic() + max(0.0, timeout)
        with st.lock:
            if any(st.buffers[s].size + n > self.column_batch_size for s, n in needs):
                return None
            # Room: the shard has no batch on its way, or these operations do not fill its buffer.
            while any(s in st.busy and st.buffers[s].size + n >= self.batch_size for s, n in needs):
                left = give_up_at - time.monotonic()
                if left <= 0 or st.closed:
                    return False
                st.room.wait(left)
            for shard, _ in needs:
                buf = st.buffers[shard]
                add(shard, buf)
                self._start_buffer(st, buf)
                if buf.size >= self.batch_size:
                    self._sender.send_in_background(st, shard)
        return True

    def ack_columns(self, roots: object, values: object, dedup_key: int = 0) -> None:
        """Buffer ACK(roots[i], values[i]) for every i, folded per root (one operation per root and key)."""
        roots_array, values_array = as_roots(roots), as_ids(values)
        _same_length(roots_array, values_array)
        if not 0 <= dedup_key <= MAX_ID:
            raise ValueError(f"dedup key {dedup_key!r} is not a 64-bit unsigned integer")
        folded_roots, folded_values = fold_xor(roots_array, values_array)
        self._add_columns(ACK, folded_roots, folded_values, dedup_key=dedup_key)

    def fail_columns(self, roots: object) -> None:
        """Buffer FAIL for every root (repeats are sent once)."""
        self._add_columns(FAIL, distinct(as_roots(roots)))

    def reset_timeout_columns(self, roots: object) -> None:
        """Buffer RESET_TIMEOUT for every root (repeats are sent once)."""
        self._add_columns(RESET_TIMEOUT, distinct(as_roots(roots)))

    def _add_columns(
        self, kind: int, roots: np.ndarray, values: np.ndarray | None = None, *, dedup_key: int = 0, spout: str = ""
    ) -> None:
        """Split the columns by shard (each replica's) and feed each shard's buffer; full buffers go out together."""
        st = self._state()
        if kind == ACK and not dedup_key and self._replicas > 1:
            dedup_key = new_id()  # one key for both replicas' copies (see ack)
        remaining = replica_slices(roots, self._n, self._replicas)
        while remaining:
            left = []
            with st.lock:
                for shard, positions in remaining:
                    buf = st.buffers[shard]
                    room = max(1, self.column_batch_size - buf.size)
                    here, rest = positions[:room], positions[room:]
                    buf.add_columns(
                        kind, roots[here], None if values is None else values[here], dedup_key=dedup_key, spout=spout
                    )
                    self._start_buffer(st, buf)
                    if rest.size:
                        left.append((shard, rest))
                full = self._sender.take(st, lambda b: b.size >= self.batch_size)
            remaining = left
            if full[0]:
                self._sender.send_now(st, *full)

    # -- sending -------------------------------------------------------------

    def flush(self) -> None:
        """Send everything buffered, to all shards in parallel, and wait for batches already being sent.

        Raises ShardUnavailable / RequestRefused naming every shard whose batch
        failed; when it returns, every operation buffered before the call was
        applied (with replicas 2: by every live replica; a batch a live partner
        covered is reported to the listeners, not raised).
        """
        st = self._state()
        with st.lock:
            earlier = list(st.sending)
            batches, sending = self._sender.take(st, lambda buf: True)
        own = self._sender.send(st, batches, sending)
        failures = list(own.failures) if own is not None else []
        for other in earlier:
            # A batch another thread is sending cannot outlive its wait_for_shard.
            other.done.wait()
            if other.error is not None:
                failures.extend(other.error.failures)
        if own is not None:
            self._report(own, False)
        if failures:
            uncovered = undelivered(batch_error(failures))
            if uncovered is not None:
                raise uncovered

    def _report(self, error: AckerError, background: bool) -> None:
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

    # -- subscriptions -------------------------------------------------------

    def subscribe(
        self,
        shard: int,
        spout: str,
        incarnation: int = 0,
        after_sequence: int = 0,
        timeout: float | None = None,
    ):
        """Open the outcome stream of ``spout`` on ``shard``: an iterator of decoded batches with ``cancel()``.

        Each batch is an :class:`~acker_protocol.packed.OutcomeBatchColumns`: the
        OutcomeBatch bytes read straight into numpy columns.

        The call waits for the shard's connection (``wait_for_ready``), so a
        stream re-opened during a blip starts the moment the network is back.
        """
        request = acker_pb2.SubscribeRequest(spout=spout, incarnation=incarnation, after_sequence=after_sequence)
        return self._state().subscribe_calls[shard](request, timeout=timeout, wait_for_ready=True)

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Flush what is buffered (errors are reported, not raised), stop the flusher and close the channels."""
        st = self._proc
        if st is None or st.pid != process.current_pid() or st.closed:
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
        st.close_channels()
        for old in self._retired:
            if old.pid == process.current_pid():  # a parent's states are the parent's to close
                self._close_retired(old)
        self._closed = True
        self._proc = None

    def _close_retired(self, old: ProcessState) -> None:
        """Send what an earlier layout's state still buffers (it re-routes), then stop it."""
        with old.lock:
            batches, sending = self._sender.take(old, lambda buf: True)
        error = self._sender.send(old, batches, sending)
        if error is not None:
            self._report(error, False)
        with old.lock:
            old.closed = True
            old.wake.notify_all()
        if old.flusher is not None and old.flusher is not threading.current_thread():
            old.flusher.join(timeout=self.deadline + 1.0)
        if old.senders is not None:
            old.senders.shutdown(wait=True)
        old.close_channels()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ClusterClient({list(self._addresses)!r})"


def _same_length(roots: np.ndarray, values: np.ndarray) -> None:
    if roots.size != values.size:
        raise ValueError(f"{roots.size} root ids but {values.size} values: give one value per root")
