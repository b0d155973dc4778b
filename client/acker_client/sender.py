"""The sending half of the cluster client: take buffers out, send one batch per shard, run the adaptive flusher.

How a batch waits for its shard and what is retried is :mod:`.delivery`; a
batch given up on is reported to the client's ``report`` callback, which tells
the listeners.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
from acker_protocol.v1 import acker_pb2

from .batching import OpBuffer
from .delivery import DROP_REPLICA, ConnectionMonitor, DeliveryPolicy, deliver
from .errors import AckerError, ShardFailure, _BatchError, batch_error, shard_failure
from .process import ProcessState, Sending

__all__ = ["Sender", "Report", "undelivered", "MAX_IN_FLIGHT"]

# Background batches one shard may have on their way at once: the one sent when the shard
# was idle and one more the flush interval sent behind it. More would only queue in the
# same connection; fewer would make a buffer wait a whole round trip past its interval.
MAX_IN_FLIGHT = 2

# report(error, background): tell the listeners (and on_error for background flushes).
Report = Callable[[AckerError, bool], None]


class Sender:
    """Sends the batches of a :class:`~acker_client.process.ProcessState`: ``deadline`` seconds per attempt,
    ``wait_for_shard`` seconds per batch in all (see :mod:`.delivery`).

    ``take`` and ``send`` are separate so the buffers are swapped out under the
    state's lock and sent outside it; every batch taken is registered as being
    sent, so a concurrent flush either sends it itself or waits for it.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        deadline: float,
        flush_interval: float,
        report: Report,
        wait_for_shard: float = 20.0,
        batch_keys: bool = True,
        send_when_idle: bool = True,
    ) -> None:
        self.addresses = tuple(addresses)
        self.deadline = deadline
        self.flush_interval = flush_interval
        self.wait_for_shard = wait_for_shard
        self.batch_keys = batch_keys
        self.send_when_idle = send_when_idle  # False: a buffer waits its full flush_interval (the old fixed linger)
        self.replicas = 1  # set by the client from the ackers' Describe
        self._report = report

    @property
    def policy(self) -> DeliveryPolicy:
        """The delivery policy of the current settings."""
        return DeliveryPolicy(
            attempt_deadline=self.deadline,
            wait_for_shard=self.wait_for_shard,
            replicas=self.replicas,
            shard_count=len(self.addresses),
        )

    def take(self, st: ProcessState, due: Callable[[OpBuffer], bool]) -> tuple[dict[int, OpBuffer], Sending]:
        """Swap out the buffers selected by ``due`` and register them as being sent (call with ``st.lock`` held)."""
        taken = {}
        for shard, buf in enumerate(st.buffers):
            if buf.started is not None and due(buf):
                taken[shard] = buf
                st.buffers[shard] = OpBuffer()
                st.connections.taken(
                    shard, buf
                )  # with the swap: the replica skip rule sees it in one place or the other
                st.stats.calls += buf.added
        sending = Sending()
        if taken:
            st.sending.add(sending)
        return taken, sending

    def send_now(self, st: ProcessState, batches: dict[int, OpBuffer], sending: Sending) -> None:
        """Send in the caller's thread; report the error of a failed batch, and raise it unless a live replica covers it."""
        error = self.send(st, batches, sending)
        if error is not None:
            self._report(error, False)
            uncovered = undelivered(error)
            if uncovered is not None:
                raise uncovered

    def send(self, st: ProcessState, batches: dict[int, OpBuffer], sending: Sending) -> _BatchError | None:
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

    def _send_batches(self, st: ProcessState, batches: dict[int, OpBuffer]) -> _BatchError | None:
        failures = deliver(
            st,
            batches,
            # The state's own shard count: a batch of an earlier layout has its partners there.
            policy=dataclasses.replace(self.policy, shard_count=len(st.addresses)),
            batch_keys=self.batch_keys,
            failure_of=self._failure,
            on_sent=_count_sent,
        )
        if failures:
            with st.lock:
                st.stats.batches_failed += len(failures)
                st.stats.operations_dropped += sum(f.operations for f in failures)
                for f in failures:
                    by_reason = st.stats.dropped_by_reason
                    by_reason[f.reason] = by_reason.get(f.reason, 0) + f.operations
            return batch_error(failures)
        return None

    def _failure(self, shard: int, exc: grpc.RpcError, count: int, init_roots: tuple[int, ...]) -> ShardFailure:
        # A batch of an earlier layout (see relayout.py) may name a shard the current one lacks.
        address = self.addresses[shard] if shard < len(self.addresses) else f"shard {shard} of an earlier layout"
        return shard_failure(shard, address, exc, count, init_roots)

    # -- background flusher --------------------------------------------------

    def ensure_flusher(self, st: ProcessState) -> None:
        """Start this process's flusher thread if it is not running (call with ``st.lock`` held)."""
        if st.flusher is None and not st.closed:
            st.flusher = threading.Thread(target=self._flush_loop, args=(st,), name="acker-client-flusher", daemon=True)
            st.flusher.start()

    def _flush_loop(self, st: ProcessState) -> None:
        """Send each shard's buffer as soon as nothing of it is in flight; while a batch is, let the next grow.

        Adaptive linger: an operation waits only while its shard is busy with
        the previous batch, so at low load every operation leaves at once and
        at high load batches grow with the round trip. ``flush_interval`` is
        the most a buffer waits behind a batch in flight: then it goes out too,
        pipelined on the same connection (at most :data:`MAX_IN_FLIGHT` per
        shard, and only to a shard whose last batch arrived: one waiting for
        its connection gets no second, and its buffer fills to ``batch_size``
        for the caller to feel the back-pressure).
        """
        while True:
            with st.lock:
                if st.closed:
                    return
                wait = self._send_due(st, time.monotonic())
                if wait != 0.0:
                    st.wake.wait(wait)

    def _send_due(self, st: ProcessState, now: float) -> float | None:
        """Send the buffers that are due (call with ``st.lock`` held); 0 if any was, else how long until one is."""
        interval = self.flush_interval
        wait: float | None = None
        for shard, buf in enumerate(st.buffers):
            if buf.started is None:
                continue
            in_flight = st.busy.get(shard, 0)
            due = buf.started + interval - now
            if not in_flight and (self.send_when_idle or due <= 0):
                self.send_in_background(st, shard)
                wait = 0.0
            elif not in_flight or (
                in_flight < MAX_IN_FLIGHT and st.connections.state(shard) == ConnectionMonitor.READY
            ):
                if due <= 0:
                    self.send_in_background(st, shard)
                    wait = 0.0
                elif wait is None or due < wait:
                    wait = due
        return wait

    def send_in_background(self, st: ProcessState, shard: int) -> None:
        """Take ``shard``'s buffer and send it on a sender thread; the shard is busy until that send ends.

        Call with ``st.lock`` held. The caller does not wait: the flusher, and
        a caller with a timeout of its own (:meth:`ClusterClient.init_within`),
        use this.
        """
        buf = st.buffers[shard]
        batches, sending = self.take(st, lambda b: b is buf)
        st.busy[shard] = st.busy.get(shard, 0) + 1
        if st.senders is None:
            st.senders = ThreadPoolExecutor(MAX_IN_FLIGHT * len(st.buffers), thread_name_prefix="acker-client-sender")
        st.senders.submit(self._background_send, st, shard, batches, sending)

    def _background_send(self, st: ProcessState, shard: int, batches: dict[int, OpBuffer], sending: Sending) -> None:
        try:
            error = self.send(st, batches, sending)
        finally:
            with st.lock:
                left = st.busy.pop(shard) - 1
                if left:
                    st.busy[shard] = left
                st.wake.notify_all()
                st.room.notify_all()
        if error is None:
            return
        if undelivered(error) is None:
            # Only a replica missed these operations; its partners hold them. The
            # listeners hear of it (a spout counts the replica's missed inits).
            self._report(error, False)
            return
        with st.lock:
            st.stats.background_errors += 1
        self._report(error, True)


def undelivered(error: _BatchError) -> _BatchError | None:
    """``error`` without the batches a live replica covered (reason ``replica``); None if nothing else failed.

    An operation counts as delivered once every live replica applied it: the
    caller hears only of batches no live replica holds.
    """
    failures = [f for f in error.failures if f.reason != DROP_REPLICA]
    if len(failures) == len(error.failures):
        return error
    return batch_error(failures) if failures else None


def _count_sent(st: ProcessState, buf: OpBuffer, count: int, response: acker_pb2.ApplyResponse) -> None:
    with st.lock:
        s = st.stats
        s.batches_sent += 1
        s.operations_sent += count
        s.operations_folded += buf.added - count
        s.applied += response.applied
        s.deduplicated += response.deduplicated
        s.ignored += response.ignored
        s.held += response.held
