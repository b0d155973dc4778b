"""The sending half of the cluster client: take buffers out, send one Apply per shard, run the age-based flusher.

A failed batch is dropped, never retried (XOR acks are not idempotent); the
error goes to the client's ``report`` callback, which tells the listeners.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import grpc
from acker_protocol.v1 import acker_pb2

from .batching import OpBuffer
from .errors import AckerError, _BatchError, batch_error, shard_failure
from .process import ProcessState, Sending

__all__ = ["Sender", "Report"]

# report(error, background): tell the listeners (and on_error for background flushes).
Report = Callable[[AckerError, bool], None]


class Sender:
    """Sends the batches of a :class:`~acker_client.process.ProcessState` with ``deadline`` seconds per call.

    ``take`` and ``send`` are separate so the buffers are swapped out under the
    state's lock and sent outside it; every batch taken is registered as being
    sent, so a concurrent flush either sends it itself or waits for it.
    """

    def __init__(self, addresses: Sequence[str], *, deadline: float, flush_interval: float, report: Report) -> None:
        self.addresses = tuple(addresses)
        self.deadline = deadline
        self.flush_interval = flush_interval
        self._report = report

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
        """Send in the caller's thread; report and raise the error of a failed batch."""
        error = self.send(st, batches, sending)
        if error is not None:
            self._report(error, False)
            raise error

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
        calls = []
        for shard, buf in batches.items():
            request = buf.to_request()
            if not request.kinds:
                continue  # everything folded away to no-op acks
            future = st.stubs[shard].Apply.future(request, timeout=self.deadline)
            calls.append((shard, buf, len(request.kinds), future))
        failures = []
        for shard, buf, count, future in calls:
            try:
                response = future.result()
            except grpc.RpcError as exc:
                failures.append(shard_failure(shard, self.addresses[shard], exc, count, buf.init_roots()))
                continue
            _count_sent(st, buf, count, response)
        if failures:
            with st.lock:
                st.stats.batches_failed += len(failures)
                st.stats.operations_dropped += sum(f.operations for f in failures)
            return batch_error(failures)
        return None

    # -- background flusher --------------------------------------------------

    def ensure_flusher(self, st: ProcessState) -> None:
        """Start this process's flusher thread if it is not running (call with ``st.lock`` held)."""
        if st.flusher is None and not st.closed:
            st.flusher = threading.Thread(target=self._flush_loop, args=(st,), name="acker-client-flusher", daemon=True)
            st.flusher.start()

    def _flush_loop(self, st: ProcessState) -> None:
        interval = self.flush_interval
        while True:
            with st.lock:
                if st.closed:
                    return
                now = time.monotonic()
                # The predicate runs inside take, in this iteration: `now` is current.
                batches, sending = self.take(
                    st,
                    lambda buf: buf.started is not None and now - buf.started >= interval,  # noqa: B023
                )
                if not batches:
                    starts: list[float] = [b.started for b in st.buffers if b.started is not None]
                    st.wake.wait(min(starts) + interval - now if starts else None)
                    continue
            error = self.send(st, batches, sending)
            if error is not None:
                with st.lock:
                    st.stats.background_errors += 1
                self._report(error, True)


def _count_sent(st: ProcessState, buf: OpBuffer, count: int, response: acker_pb2.ApplyResponse) -> None:
    with st.lock:
        s = st.stats
        s.batches_sent += 1
        s.operations_sent += count
        s.operations_folded += buf.added - count
        s.applied += response.applied
        s.deduplicated += response.deduplicated
        s.ignored += response.ignored
