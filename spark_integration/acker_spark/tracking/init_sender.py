"""Sending a reading task's inits off its read path: one sender thread per task, a few batches behind the reader.

The reading task (:class:`~acker_spark.executor_read.source_reader.SourceReader`)
starts the trees of each Arrow batch it reads. Writing the emission log is
quick (a local append); sending the inits is not: a batch of 10,000 rows fills
the client's per-shard buffers, and the client sends a full buffer in the
caller's thread and waits for the acker's answer. Done on the read path, the
task stops reading for a round trip per batch.

:class:`InitSender` takes that wait off the read path. Its
:meth:`~InitSender.init_columns` hands a batch's columns to one thread of the
task, which calls the client's ``init_columns``, and returns at once; the task
reads on. What stays as it was:

- **The emission log first.** The caller logs a batch's roots before handing
  its inits over (:func:`~acker_spark.tracking.tree_start.start_trees`),
  so a tree the ackers know is always in the log. Sending later only widens
  the window in which a logged tree is unknown to the ackers, which the driver
  already handles (a task that dies after logging: lost, replayed).
- **The task ends after its inits are applied.** :meth:`~InitSender.flush`
  waits for the thread to send everything handed to it, then flushes the
  client; a task returns only after that.
- **A failed delivery fails the task.** The thread keeps the first error; the
  next hand-off or the flush raises it in the task, and Spark retries the task.
- **Bounded.** At most ``depth`` batches wait for the thread; one more blocks
  the reader, which is the back-pressure a slow or unreachable acker exerts.

An ack may reach an acker before its tree's init (a bolt downstream sends it
from another process): the ledger keeps it until the init comes
(docs/acker-semantics.md), so the order of inits and acks does not matter.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np

__all__ = ["InitSender", "DEFAULT_DEPTH"]

DEFAULT_DEPTH = 4
"""Batches that may wait for the sender thread: enough to cover a round trip's jitter, few enough to bound memory."""

_END = None  # the queue's last item: the thread stops after it


class InitSender:
    """One task's inits, sent by a thread of its own while the task reads on (see the module).

    ``client`` is anything with ``init_columns(roots, values, spout)`` and
    ``flush()`` (a :class:`~acker_client.ClusterClient`). Not shared between
    tasks: one reading task, one sender, used from the task's thread.
    """

    def __init__(self, client: Any, *, depth: int = DEFAULT_DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1 batch, got {depth}")
        self._client = client
        self._queue: queue.Queue[tuple[np.ndarray, np.ndarray, str] | None] = queue.Queue(maxsize=depth)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._abandoned = False  # closed without a flush: the thread drops what is left

    def init_columns(self, roots: np.ndarray, values: np.ndarray, spout: str) -> None:
        """Hand one batch's inits to the sender thread and return (blocks only while ``depth`` batches wait).

        Raises the error of an earlier batch that could not be delivered.
        """
        self._raise_failure()
        if self._thread is None:
            self._thread = threading.Thread(target=self._send_loop, name="acker-init-sender", daemon=True)
            self._thread.start()
        self._queue.put((roots, values, spout))

    def flush(self) -> None:
        """Wait until every batch handed over was sent, then flush the client: every init applied, or raise."""
        if self._thread is not None:
            self._queue.put(_END)
            self._thread.join()
            self._thread = None
        self._raise_failure()
        self._client.flush()

    def close(self) -> None:
        """Stop without waiting (the task is failing anyway): batches not yet sent are dropped.

        A dropped init leaves a logged tree the ackers never heard of: the
        driver finds no outcome for it and replays it, as for a task that died.
        A no-op after :meth:`flush`.
        """
        if self._thread is None:
            return
        self._abandoned = True
        while True:  # make room for the end marker: this thread is the only producer
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put_nowait(_END)
        self._thread = None  # a daemon: it ends after the call it may be in

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def _send_loop(self) -> None:
        """The sender thread: send each batch in turn; after a failure or a close, drain to the end marker."""
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if self._error is not None or self._abandoned:
                continue  # keep draining, so that the reader never blocks on a full queue
            roots, values, spout = item
            try:
                self._client.init_columns(roots, values, spout)
            except BaseException as error:  # noqa: BLE001 - handed to the task's thread, which raises it
                self._error = error
