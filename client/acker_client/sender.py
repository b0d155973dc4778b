"""The sending half of the cluster client: take buffers out, send one Apply per shard, run the age-based flusher.

How a batch waits for its shard and what is retried is :mod:`.delivery`; a
batch given up on is reported to the client's ``report`` callback, which tells
the listeners.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
from acker_protocol.v1 import acker_pb2

from .batching import OpBuffer
from .delivery import DROP_REPLICA, DeliveryPolicy, deliver
from .errors import AckerError, ShardFailure, _BatchError, batch_error, shard_failure
from .process import ProcessState, Sending

__all__ = ["Sender", "Report", "undelivered"]

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
    ) -> None:
        self.addresses = tuple(addresses)
        self.deadline = deadline
        self.flush_interval = flush_interval
        self.wait_for_shard = wait_for_shard
        self.batch_keys = batch_keys
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
            policy=self.policy,
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
        return shard_failure(shard, self.addresses[shard], exc, count, init_roots)

    # -- background flusher --------------------------------------------------

    def ensure_flusher(self, st: ProcessState) -> None:
        """Start this process's flusher thread if it is not running (call with ``st.lock`` held)."""
        if st.flusher is None and not st.closed:
            st.flusher = threading.Thread(target=self._flush_loop, args=(st,), name="acker-client-flusher", daemon=True)
            st.flusher.start()

    def _flush_loop(self, st: ProcessState) -> None:
        while True:
            with st.lock:
                if st.closed:
                    return
                interval = self.flush_interval
                now = time.monotonic()
                started = False
                for shard, buf in enumerate(st.buffers):
                    # A shard whose last aged batch is still waiting for its
                    # connection is skipped: its buffer fills up to batch_size,
                    # and the caller that fills it waits (back-pressure).
                    if shard in st.busy or buf.started is None or now - buf.started < interval:
                        continue
                    self.send_in_background(st, shard)
                    started = True
                if not started:
                    starts = [b.started for i, b in enumerate(st.buffers) if b.started is not None and i not in st.busy]
                    st.wake.wait(min(starts) + interval - now if starts else None)

    def send_in_background(self, st: ProcessState, shard: int) -> None:
        """Take ``shard``'s buffer and send it on a sender thread; the shard is busy until that send ends.

        Call with ``st.lock`` held and the shard not busy. The caller does not
        wait: the flusher, and a caller with a timeout of its own
        (:meth:`ClusterClient.init_within`), use this.
        """
        buf = st.buffers[shard]
        batches, sending = self.take(st, lambda b: b is buf)
        st.busy.add(shard)
        if st.senders is None:
            st.senders = ThreadPoolExecutor(len(st.buffers), thread_name_prefix="acker-client-sender")
        st.senders.submit(self._background_send, st, shard, batches, sending)

    def _background_send(self, st: ProcessState, shard: int, batches: dict[int, OpBuffer], sending: Sending) -> None:
        try:
            error = self.send(st, batches, sending)
        finally:
            with st.lock:
                st.busy.discard(shard)
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
