"""Per-process client state: channels, buffers and counters that never cross a fork, and the shared clients.

PySpark forks its Python workers from a daemon and reuses them across tasks. A
gRPC channel made before a fork fails in the child, so everything that talks
to the network lives in a :class:`ProcessState` tagged with the pid that made
it; a client in a forked child notices the new pid and builds its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any

from acker_protocol import grpc_options
from acker_protocol.credentials import ChannelSecurity, open_channel
from acker_protocol.packed import decode_outcome_batch
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from .apply_stream import ApplyChannel
from .batching import OpBuffer
from .delivery import ConnectionMonitor

__all__ = ["ClientStats", "ProcessState", "Sending", "current_pid"]

_APPLY = "/acker_service.v1.Acker/Apply"
_SUBSCRIBE = "/acker_service.v1.Acker/Subscribe"
# gRPC shares one connection between channels of equal options to the same address;
# a channel with its own subchannel pool opens a connection of its own.
_OWN_CONNECTION = ("grpc.use_local_subchannel_pool", 1)


def _as_is(data: bytes) -> bytes:
    """The identity serializer: the request is already its bytes."""
    return data


# os.getpid() is a real system call, too dear for every ack (its cost:
# docs/benchmarks.md). Python runs this hook in the child of every os.fork(), which
# is how PySpark's daemon and multiprocessing's "fork" context create workers.
_pid = os.getpid()
# Guards the creation of a process's state. Replaced in a forked child: another
# thread of the parent may have held it at the moment of the fork.
state_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _pid, state_lock
    _pid = os.getpid()
    state_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_pid() -> int:
    """This process's id, without a system call."""
    return _pid


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
    held: int = 0  # operations an acker held during a layout change (applied once their trees arrived)
    batches_retried: int = 0  # attempts repeated after a transient failure
    batches_rerouted: int = 0  # batches refused by an acker that left their roots, sent on by a newer layout
    operations_retried: int = 0
    operations_waiting: int = 0  # now: in batches waiting for their shard's connection (a gauge)
    # Replicas 2: operations sent again to a replica that failed after applying them while their other
    # copy was still on its way (its crash may have lost them; see acker_client.delivery).
    operations_put_back: int = 0
    # Operations dropped, by reason: "refused", "timeout", "ambiguous" (acker_client.delivery).
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    # Each shard's connection as last seen: UNKNOWN, READY, WAITING (retrying) or UNREACHABLE.
    shard_states: tuple[str, ...] = ()

    def copy(self) -> ClientStats:
        """A snapshot."""
        snapshot = ClientStats(**{f.name: getattr(self, f.name) for f in fields(self)})
        snapshot.dropped_by_reason = dict(self.dropped_by_reason)
        return snapshot


class Sending:
    """Batches taken out of the buffers and being sent; :meth:`ClusterClient.flush` waits for these."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: Any = None  # the _BatchError of a failed send


class ProcessState:
    """Channels, stubs, buffers and the flusher thread of one process (never shared across a fork)."""

    def __init__(
        self,
        addresses: Sequence[str],
        options: list[tuple[str, int]] | None = None,
        security: ChannelSecurity | None = None,
        streams: Sequence[bool] | None = None,
    ) -> None:
        self.pid = _pid
        self.addresses = list(addresses)
        # Set by the client: (state, shard, refused request bytes) -> whether a newer layout took the batch.
        self.relayout: Callable[[ProcessState, int, bytes], bool] | None = None
        # The layout epoch these addresses are (0: as the client was given them): every request names it.
        self.epoch = 0
        options = options if options is not None else grpc_options.client_options()
        self.channels = [open_channel(a, security, options) for a in addresses]
        self.stubs = [acker_pb2_grpc.AckerStub(c) for c in self.channels]
        # The columnar calls: Apply sends request bytes as they are (encoded once by the
        # buffer), Subscribe reads OutcomeBatch bytes straight into numpy columns.
        # Each shard's batches go over one ApplyStream, or Apply where the acker lacks it
        # (``streams[i]`` False: its Describe said so, or the client was told not to stream).
        streams = streams if streams is not None else [True] * len(addresses)
        self.apply_calls = [
            ApplyChannel(
                c,
                c.unary_unary(
                    _APPLY, request_serializer=_as_is, response_deserializer=acker_pb2.ApplyResponse.FromString
                ),
                stream=stream,
            )
            for c, stream in zip(self.channels, streams)
        ]
        # Outcome streams get channels (and connections) of their own. The sync gRPC
        # client handles every call of a channel on one thread, under one channel-wide
        # lock: on the Apply channel an outcome waited behind the ApplyStream's sends
        # and acks, so it reached the spout with the next batches' traffic (the
        # columnar bench's latency followed its batch interval: docs/benchmarks.md).
        self.outcome_channels = [open_channel(a, security, [*options, _OWN_CONNECTION]) for a in addresses]
        self.subscribe_calls = [
            c.unary_stream(
                _SUBSCRIBE,
                request_serializer=acker_pb2.SubscribeRequest.SerializeToString,
                response_deserializer=decode_outcome_batch,
            )
            for c in self.outcome_channels
        ]
        self.connections = ConnectionMonitor(len(addresses))
        self.buffers = [OpBuffer() for _ in addresses]
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.flusher: threading.Thread | None = None
        # The flusher hands each shard's aged batch to one of these threads, so
        # that a shard waiting for its connection holds up no other shard.
        self.senders: ThreadPoolExecutor | None = None
        self.busy: dict[int, int] = {}  # shard -> background sends in progress (absent: none)
        # Notified when a shard stops being busy: callers waiting, with a timeout, for room in its buffer.
        # Not ``wake``: its notify() is meant for the flusher and must never wake such a caller instead.
        self.room = threading.Condition(self.lock)
        self.closed = False
        self.sending: set[Sending] = set()
        self.stats = ClientStats()

    def close_channels(self) -> None:
        """Close every channel of this state: the Apply and Describe ones and the outcome streams' ones."""
        for channel in (*self.channels, *self.outcome_channels):
            channel.close()
