"""One shard's outcome stream for one spout: reconnects with backoff and resumes after the last outcome seen."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
import numpy as np
from acker_protocol.packed import OutcomeBatchColumns

if TYPE_CHECKING:
    from .cluster import ClusterClient

__all__ = ["OutcomeSubscription"]

log = logging.getLogger(__name__)

# (root ids as uint64, wire outcomes as int32, latencies in microseconds as uint64): one call per batch.
DeliverBatch = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


class OutcomeSubscription:
    """Consumes ``spout``'s outcomes from one shard in a background thread.

    The acker numbers each spout's outcomes per incarnation; reconnecting with
    the last ``(incarnation, sequence)`` processed resumes exactly after it, so
    a broken stream loses nothing and repeats nothing. A sequence already seen
    is skipped anyway (and counted), so a server that re-sends cannot cause a
    second callback.

    Outcomes go to ``deliver_batch(roots, outcomes, latency_micros)`` once per
    batch the acker streams, as numpy arrays: the stream's bytes are decoded
    straight into columns (:func:`~acker_protocol.packed.decode_outcome_batch`),
    without a Python object per entry.
    """

    def __init__(
        self,
        cluster: ClusterClient,
        shard: int,
        spout: str,
        *,
        deliver_batch: DeliverBatch,
        on_dropped: Callable[[int], None] | None = None,
        on_state: Callable[[int, bool], None] | None = None,
        initial_backoff: float = 0.05,
        max_backoff: float = 1.0,
    ) -> None:
        self.cluster = cluster
        self.shard = shard
        # Bound to the acker, not to a position: after a layout change shard i may be another acker.
        addresses = getattr(cluster, "addresses", None)
        self.address = addresses[shard] if addresses else None
        self.spout = spout
        self._deliver_batch = deliver_batch
        self._on_dropped = on_dropped
        self._on_state = on_state
        self.connected = False
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self.incarnation = 0
        self.last_sequence = 0
        self.reconnects = 0
        self.duplicates_skipped = 0
        self.batches = 0
        self._call = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"acker-subscription-{shard}", daemon=True)

    def start(self) -> OutcomeSubscription:
        """Start the background thread."""
        self._thread.start()
        return self

    def interrupt(self) -> None:
        """Cancel the current stream; the subscription reconnects and resumes (used to test resume)."""
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def close(self, timeout: float = 5.0) -> None:
        """Cancel the stream and stop the thread."""
        self._closing.set()
        self.interrupt()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        delay = self._initial_backoff
        while not self._closing.is_set():
            opened = time.monotonic()
            received = self._consume_once()
            if self._closing.is_set():
                return
            if received or time.monotonic() - opened > 1.0:
                delay = self._initial_backoff  # the acker was healthy: reconnect quickly
            self.reconnects += 1
            # Jitter keeps many spouts from reconnecting to a restarted acker in lockstep.
            self._closing.wait(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self._max_backoff)

    def _consume_once(self) -> bool:
        """Open one stream and process it until it ends; True if any batch arrived."""
        received = False
        try:
            subscribe_at = getattr(self.cluster, "subscribe_at", None)
            if subscribe_at is not None and self.address is not None:
                call = subscribe_at(self.address, self.spout, self.incarnation, self.last_sequence)
            else:  # a stand-in cluster of the tests
                call = self.cluster.subscribe(self.shard, self.spout, self.incarnation, self.last_sequence)
        except Exception:  # e.g. the client was closed under us
            log.exception("could not subscribe to shard %d", self.shard)
            return False
        with self._lock:
            self._call = call
        if self._closing.is_set():
            call.cancel()
        try:
            # The acker sends its headers as soon as the stream is set up, so
            # this returns once the stream is really open (or has failed).
            initial_metadata = getattr(call, "initial_metadata", None)
            if initial_metadata is not None:
                initial_metadata()
            self._set_connected(True)
            for batch in call:
                self._handle(batch)
                received = True
        except grpc.RpcError as exc:
            self._log_break(exc)
        finally:
            with self._lock:
                self._call = None
            call.cancel()
            self._set_connected(False)
        return received

    def _set_connected(self, connected: bool) -> None:
        if connected == self.connected:
            return
        self.connected = connected
        if self._on_state is not None and not self._closing.is_set():
            self._on_state(self.shard, connected)

    def _log_break(self, exc: grpc.RpcError) -> None:
        if self._closing.is_set():
            return
        code = exc.code()
        if code == grpc.StatusCode.ABORTED:
            log.error(
                "outcome stream of spout %r on shard %d was taken over by another subscriber; "
                "two spouts must not share a name",
                self.spout,
                self.shard,
            )
        elif code != grpc.StatusCode.CANCELLED:
            log.info("outcome stream of shard %d broke (%s: %s); reconnecting", self.shard, code.name, exc.details())

    def _handle(self, batch: OutcomeBatchColumns) -> None:
        self.batches += 1
        if batch.incarnation != self.incarnation:
            # First batch, or the acker restarted: its sequence numbers start over.
            self.incarnation = batch.incarnation
            self.last_sequence = 0
        first, count = batch.first_sequence, len(batch.root_ids)
        # A batch's sequences are consecutive, so those already processed are a prefix of it.
        skip = min(count, max(0, self.last_sequence - first + 1))
        self.duplicates_skipped += skip
        # The three arrays are parallel; a malformed batch is cut to the shortest (as zip would).
        end = min(count, len(batch.outcomes), len(batch.latency_micros))
        if skip < end:
            self._deliver_batch(
                batch.root_ids[skip:end], batch.outcomes[skip:end].astype(np.int32), batch.latency_micros[skip:end]
            )
        self.last_sequence = max(self.last_sequence, first + count - 1)
        if batch.dropped and self._on_dropped is not None:
            self._on_dropped(batch.dropped)
