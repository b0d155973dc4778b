"""One shard's Apply calls carried on one long-lived ApplyStream, behind the unary call's ``future()``.

A unary Apply pays grpc's per-call work on both sides for every batch (the
acker's profile put it at 40% of its CPU); on a stream a batch is one message
each way. :class:`ApplyChannel` keeps :mod:`.delivery` unaware of the
difference: ``future(request, timeout=..., wait_for_ready=...)`` returns
something whose ``result()`` gives the counts (an ``ApplyAck`` has the fields
of an ``ApplyResponse``) or raises a ``grpc.RpcError`` with the status the
unary call would have ended with, so deadlines, retries, replicas and drop
reasons stay the delivery module's.

The stream's rules, per batch as for the unary call:

- The acker answers requests in order, so the n-th ack answers the n-th
  request written on the call.
- A batch whose ack does not come within its deadline fails with
  DEADLINE_EXCEEDED ("may or may not be applied", as a unary deadline). The
  stream is abandoned with it, so the retry goes out on a fresh call, as a
  unary retry would, instead of queueing behind a connection that stalled.
- A stream that breaks fails every batch it had not acknowledged with a
  retryable status (UNAVAILABLE), unless the break concerns the batches
  themselves: RESOURCE_EXHAUSTED (a message over the acker's receive limit,
  which is the oldest unacknowledged one) fails that batch only, and a
  refusal of the caller (UNAUTHENTICATED, PERMISSION_DENIED) fails them all.
- An acker without ApplyStream (UNIMPLEMENTED: an older server) turns this
  shard over to the unary call for good; the batches on the stream are sent
  there (nothing of them was applied).

Fork safety: an open stream keeps a thread waiting inside gRPC for its acks,
and gRPC's fork handlers must not run while a thread is inside it (PySpark's
daemon forks its workers). So every stream is closed just before this
process forks (``os.register_at_fork``), its reader thread joined; the next
batch opens a new one. A batch in flight at that moment fails UNAVAILABLE and
is retried like one on a broken stream.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from acker_protocol.v1 import acker_pb2

__all__ = ["ApplyChannel", "StreamStatus", "APPLY_STREAM_METHOD", "close_streams_before_fork"]

APPLY_STREAM_METHOD = "/acker_service.v1.Acker/ApplyStream"

log = logging.getLogger(__name__)

# Statuses of a broken stream that concern the caller, not one batch: every batch on the stream gets them.
_CALLER_REFUSALS = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
_CODES = {code.value[0]: code for code in grpc.StatusCode}
# One lock for every batch's answer: settling is rare and short (once per batch), so it is never contended.
_settling = threading.Lock()


class StreamStatus(grpc.RpcError):
    """A batch's failure on the stream, shaped as a unary call's error: ``code()`` and ``details()``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        """The status the batch failed with."""
        return self._code

    def details(self) -> str:
        """Why, in words."""
        return self._details


class _Batch:
    """One request on its way: done when acked, refused, failed with its stream, or handed to the unary call."""

    __slots__ = ("request", "deadline", "wait_for_ready", "_done", "_ack", "_error", "_unary", "_stream")

    def __init__(self, request: bytes, deadline: float, wait_for_ready: bool | None) -> None:
        self.request = request
        self.deadline = deadline  # monotonic time its ack is due
        self.wait_for_ready = wait_for_ready
        self._done = threading.Event()
        self._ack: acker_pb2.ApplyAck | None = None
        self._error: grpc.RpcError | None = None
        self._unary: Any = None  # the unary call's future, once handed over
        self._stream: _Stream | None = None

    def settle(
        self, ack: acker_pb2.ApplyAck | None = None, error: grpc.RpcError | None = None, unary: Any = None
    ) -> bool:
        """Record the batch's answer and wake its waiter; False if it had one already (the first counts)."""
        with _settling:
            if self._done.is_set():
                return False
            self._ack, self._error, self._unary = ack, error, unary
            self._done.set()
            return True

    def result(self) -> acker_pb2.ApplyAck:
        """The ack, or raise the batch's ``grpc.RpcError`` (DEADLINE_EXCEEDED when it is not acked in time)."""
        if not self._done.wait(max(0.0, self.deadline - time.monotonic())):
            overdue = StreamStatus(grpc.StatusCode.DEADLINE_EXCEEDED, "the acker did not acknowledge the batch in time")
            if self.settle(error=overdue) and self._stream is not None:
                self._stream.abandon()
        if self._unary is not None:
            return self._unary.result()
        if self._error is not None:
            raise self._error
        return self._ack  # type: ignore[return-value]

    def done(self) -> bool:
        """Whether the batch has its answer (for a batch handed to the unary call: that call's)."""
        if not self._done.is_set():
            return False
        return self._unary is None or self._unary.done()

    def exception(self) -> BaseException | None:
        """The batch's error once it has its answer (None: applied); waits for it, as :meth:`result` does."""
        try:
            self.result()
        except grpc.RpcError as exc:
            return exc
        return None

    def cancel(self) -> bool:
        """Stop waiting for the batch (it may still be applied, as a cancelled unary call may)."""
        self.settle(error=StreamStatus(grpc.StatusCode.CANCELLED, "the batch was cancelled by the client"))
        return True


class _Stream:
    """One ApplyStream call: a queue feeding its requests, a thread matching its acks to the batches in order."""

    def __init__(self, owner: ApplyChannel, wait_for_ready: bool | None) -> None:
        self._owner = owner
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._unacked: collections.deque[_Batch] = collections.deque()
        self._lock = threading.Lock()
        self.broken = False
        self._ended: tuple[grpc.StatusCode, str] | None = None  # how the call ended, once it has
        self._sequence = 0
        self._call = owner.stream_call(self._feed(), wait_for_ready=wait_for_ready)
        self._reader = threading.Thread(target=self._read, name="acker-client-apply-stream", daemon=True)
        self._reader.start()

    def _feed(self) -> Iterator[bytes]:
        # grpc's own thread pulls the requests from here; None ends the client's side.
        while (request := self._requests.get()) is not None:
            yield request

    def send(self, batch: _Batch) -> bool:
        """Queue the batch on this call; False if the call is already broken (open another)."""
        with self._lock:
            if self.broken:
                return False
            batch._stream = self
            # Both under the lock: the acks come in the order the requests were queued.
            self._unacked.append(batch)
            self._requests.put(batch.request)
        return True

    def _read(self) -> None:
        try:
            for ack in self._call:
                with self._lock:
                    self._sequence += 1
                    batch = self._unacked.popleft()
                if ack.sequence != self._sequence:  # a broken promise of the acker: trust nothing after it
                    raise StreamStatus(
                        grpc.StatusCode.INTERNAL, f"ack {ack.sequence} came for request {self._sequence}"
                    )
                if ack.code:
                    code = _CODES.get(ack.code, grpc.StatusCode.UNKNOWN)
                    batch.settle(error=StreamStatus(code, ack.message))
                else:
                    batch.settle(ack=ack)
            self._end(grpc.StatusCode.UNAVAILABLE, "the acker ended the apply stream")
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            self._end(code, details or "")
        except Exception as exc:  # a decoding bug must not leave batches waiting for their deadline
            self._end(grpc.StatusCode.INTERNAL, f"the apply stream failed: {exc}")

    def _end(self, code: grpc.StatusCode, details: str) -> None:
        """Fail (or hand over) every batch not acknowledged, by the rules of the module docstring."""
        with self._lock:
            self.broken = True
            self._ended = (code, details)
            unacked, self._unacked = list(self._unacked), collections.deque()
        self._requests.put(None)
        if code == grpc.StatusCode.UNIMPLEMENTED:
            self._owner.use_unary("the acker does not offer ApplyStream")
        for i, batch in enumerate(unacked):
            self._fail(batch, code, details, oldest=i == 0)

    def fail_late(self, batch: _Batch) -> None:
        """Answer a batch that came after the call ended (a new call that failed at once) as if it had been on it."""
        with self._lock:
            code, details = self._ended or (grpc.StatusCode.UNAVAILABLE, "the apply stream was closed")
        self._fail(batch, code, details, oldest=False)

    def _fail(self, batch: _Batch, code: grpc.StatusCode, details: str, oldest: bool) -> None:
        if code == grpc.StatusCode.UNIMPLEMENTED:
            self._owner.send_unary(batch)  # nothing of it was applied: the unary call takes it over
        elif code in _CALLER_REFUSALS or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and oldest):
            batch.settle(error=StreamStatus(code, details))
        else:
            # Not acknowledged: may or may not be applied, and worth sending again on a new call.
            batch.settle(error=StreamStatus(grpc.StatusCode.UNAVAILABLE, f"the apply stream broke: {details}"))

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the reader thread to end (after :meth:`close`)."""
        if self._reader is not threading.current_thread():
            self._reader.join(timeout)

    def abandon(self) -> None:
        """Give up on this call (a batch's ack is overdue): the others are sent again on a new one."""
        with self._lock:
            self.broken = True
        self._call.cancel()

    def close(self) -> None:
        """End the client's side; the acker answers what it has, then the call ends."""
        with self._lock:
            self.broken = True
        self._requests.put(None)
        self._call.cancel()


class ApplyChannel:
    """Apply to one shard: over ApplyStream, or the unary call when the acker lacks the stream (or ``stream`` is False).

    ``future(request_bytes, timeout=..., wait_for_ready=...)`` as a unary
    multi-callable's. Thread-safe.
    """

    def __init__(self, channel: grpc.Channel, unary_call: Any, *, stream: bool = True) -> None:
        self._unary_call = unary_call
        self.stream_call: Callable[..., Any] = channel.stream_stream(
            APPLY_STREAM_METHOD,
            request_serializer=_as_is,
            response_deserializer=acker_pb2.ApplyAck.FromString,
        )
        self.streaming = stream
        self._stream: _Stream | None = None
        self._lock = threading.Lock()
        _channels.add(self)

    def use_unary(self, why: str) -> None:
        """Send every later batch with the unary Apply."""
        if self.streaming:
            log.info("sending with Apply instead of ApplyStream: %s", why)
        self.streaming = False

    def send_unary(self, batch: _Batch) -> None:
        """Hand a batch from the stream over to the unary call, with what is left of its deadline."""
        left = max(0.0, batch.deadline - time.monotonic())
        batch.settle(unary=self._unary_call.future(batch.request, timeout=left, wait_for_ready=batch.wait_for_ready))

    def future(self, request: bytes, timeout: float, wait_for_ready: bool | None = None) -> Any:
        """Send ``request`` (ApplyRequest bytes); ``result()`` of what is returned waits for its answer."""
        if not self.streaming:
            return self._unary_call.future(request, timeout=timeout, wait_for_ready=wait_for_ready)
        batch = _Batch(request, time.monotonic() + timeout, wait_for_ready)
        with self._lock:
            stream = self._stream
            if stream is not None and stream.send(batch):
                return batch
            # No call yet, or it broke: a new one. It may fail at once (its channel cannot
            # connect and wait_for_ready is off); the batch then fails as it would have on it.
            stream = self._stream = _Stream(self, wait_for_ready)
            if not stream.send(batch):
                stream.fail_late(batch)
        return batch

    def close(self, wait: float = 0.0) -> None:
        """End the current stream (the channel's close ends it too); wait up to ``wait`` s for its reader thread."""
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
            stream.join(wait)


# Every ApplyChannel of this process, to close their streams before a fork (weak: a closed client's go away).
_channels: weakref.WeakSet[ApplyChannel] = weakref.WeakSet()
# How long a fork waits for one stream's reader thread to leave gRPC.
_FORK_JOIN_SECONDS = 1.0


def close_streams_before_fork() -> None:
    """Close every open stream and join its reader, so no thread of the client waits inside gRPC at a fork."""
    for channel in list(_channels):
        channel.close(wait=_FORK_JOIN_SECONDS)


os.register_at_fork(before=close_streams_before_fork)


def _as_is(data: bytes) -> bytes:
    """The identity serializer: the request is already its bytes."""
    return data
