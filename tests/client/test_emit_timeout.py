"""Spout.emit(timeout=...) and try_emit hold their promise while the ackers are unreachable (issue 21).

The client's buffer of a shard that cannot be reached fills up, and before
the fix the emit that filled it sent the batch in its own thread and waited
for the shard (up to ``wait_for_shard``), so ``emit(timeout=0.5)`` blocked for
seconds and ``try_emit`` did not return at once.
"""

from __future__ import annotations

import threading

from acker_client import ClusterClient, Spout, SpoutFull
from acker_client.testing import unreachable_addresses


def test_emit_and_try_emit_keep_their_timeout_while_the_shard_is_unreachable(recorder):
    # The shard's batches wait for it for 3 s: long enough to tell "returned on
    # its own timeout" (the batch is still waiting) from "waited for the batch".
    cluster = ClusterClient(unreachable_addresses(1), verify=False, batch_size=2, wait_for_shard=3.0, deadline=3.0)
    spout = Spout(cluster, on_ack=recorder.on_ack, on_fail=recorder.on_fail, timeout=60.0).start()
    emitted, refused, refused_at_once = [], [], []
    try:
        for i in range(6):
            try:
                spout.emit(f"record-{i}", i, timeout=0.5)
                emitted.append(i)
            except SpoutFull:
                refused.append(i)
        # The shard's batch is still waiting for its connection: no emit waited for it.
        in_flight = cluster.stats
        assert in_flight.batches_failed == 0, "an emit waited until its shard's batch was given up on"
        assert refused, "emit(timeout=0.5) never reported back-pressure while the shard was unreachable"
        refused_at_once.append(spout.try_emit("one more", "try"))
        assert cluster.stats.batches_failed == 0, "try_emit waited for the shard"
        assert refused_at_once == [None]
        # A refused record was never emitted: it is not pending and gets no callback.
        assert spout.pending == len(emitted)
        assert spout.stats.emitted == len(emitted)
    finally:
        _close(spout, cluster)
    recorder.assert_exactly_once(emitted)


def test_emit_many_keeps_its_timeout_while_the_shard_is_unreachable_all_or_none(recorder):
    """emit_many(timeout=0.5) raises SpoutFull with nothing emitted once the shard's buffer stays full."""
    cluster = ClusterClient(unreachable_addresses(1), verify=False, batch_size=4, wait_for_shard=3.0, deadline=3.0)
    spout = Spout(cluster, on_ack=recorder.on_ack, on_fail=recorder.on_fail, timeout=60.0).start()
    emitted: list[int] = []
    refused = 0
    try:
        for batch in range(4):
            ids = [batch * 3 + i for i in range(3)]
            try:
                spout.emit_many([f"r{i}" for i in ids], ids, timeout=0.5)
                emitted += ids
            except SpoutFull:
                refused += 1
        assert cluster.stats.batches_failed == 0, "an emit_many waited until its shard's batch was given up on"
        assert refused, "emit_many(timeout=0.5) never reported back-pressure while the shard was unreachable"
        assert spout.pending == spout.stats.emitted == len(emitted)
    finally:
        _close(spout, cluster)
    recorder.assert_exactly_once(emitted)


def _close(spout: Spout, cluster: ClusterClient) -> None:
    """Close the spout (pending records end LOST), then the client, whose close waits out its batches (3 s)."""
    spout.close()
    closing = threading.Thread(target=cluster.close)
    closing.start()
    closing.join(30)
