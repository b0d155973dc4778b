"""What the client may repeat after a failure, batch dedup keys, and the spout's backstop pausing while a stream is down."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from acker_client import ClusterClient, Spout
from acker_client.batching import ACK as ACK_KIND
from acker_client.batching import OpBuffer
from acker_client.delivery import DROP_AMBIGUOUS, DROP_REFUSED, DeliveryPolicy, retry_safe
from acker_protocol import grpc_options
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import Outcome

from .fakes import RecordingCluster
from .polling import wait_until

ACK = acker_pb2.OP_KIND_ACK


def _buffer() -> OpBuffer:
    buf = OpBuffer()
    buf.init(11, 5, "s")
    buf.fail(12)
    buf.ack(13, 7)
    buf.ack(13, 1)  # folds with the first: one operation
    buf.ack(14, 9, dedup_key=99)
    buf.reset_timeout(15)
    return buf


def test_batch_key_goes_to_unkeyed_acks_only():
    """Unkeyed ACKs carry the batch key; keyed ACKs keep theirs; INIT, FAIL and RESET_TIMEOUT carry none."""
    request = _buffer().to_request(batch_key=4242)
    keyed = dict(zip(request.root_ids, request.dedup_keys))
    assert keyed == {11: 0, 12: 0, 13: 4242, 14: 99, 15: 0}
    assert dict(zip(request.root_ids, request.values))[13] == 7 ^ 1


def test_without_batch_key_an_unkeyed_ack_makes_the_batch_unsafe():
    """Repeating an unkeyed XOR ack would undo it: such a batch is not retry-safe; a keyed or ack-free one is."""
    assert not retry_safe(_buffer().to_request())
    assert retry_safe(_buffer().to_request(batch_key=1))
    idempotent = OpBuffer()
    idempotent.init(1, 2, "s")
    idempotent.fail(3)
    idempotent.reset_timeout(4)
    assert retry_safe(idempotent.to_request())


@pytest.mark.parametrize(
    ("code", "safe", "expected"),
    [
        (grpc.StatusCode.UNAVAILABLE, True, None),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True, None),
        (grpc.StatusCode.DEADLINE_EXCEEDED, False, DROP_AMBIGUOUS),
        (grpc.StatusCode.UNAVAILABLE, False, DROP_AMBIGUOUS),
        (grpc.StatusCode.INVALID_ARGUMENT, True, DROP_REFUSED),
        (grpc.StatusCode.FAILED_PRECONDITION, True, DROP_REFUSED),
        (grpc.StatusCode.UNKNOWN, True, DROP_AMBIGUOUS),
    ],
)
def test_retry_only_transient_failures_of_safe_batches(code, safe, expected):
    """Transient codes are retried for a safe batch; refusals never; anything unsafe is dropped as ambiguous."""
    assert DeliveryPolicy.should_retry(code, safe) == expected


def test_attempts_never_run_past_the_budget():
    """Each attempt gets the call deadline, cut short by what is left of wait_for_shard."""
    policy = DeliveryPolicy(attempt_deadline=5.0, wait_for_shard=20.0)
    assert policy.attempt_timeout(give_up_at=100.0, now=50.0) == 5.0
    assert policy.attempt_timeout(give_up_at=100.0, now=98.5) == pytest.approx(1.5)
    assert policy.attempt_timeout(give_up_at=100.0, now=101.0) == 0.0
    assert 0.025 <= policy.next_backoff(0.0) <= 0.05 and policy.next_backoff(10.0) <= 1.0


def _spout(clock, timeout=10.0, shards=2):
    cluster = RecordingCluster(shard_count=shards)
    calls = []
    spout = Spout(
        cluster,
        on_ack=lambda m: calls.append((m, None)),
        on_fail=lambda m, r: calls.append((m, r)),
        timeout=timeout,
        clock=clock,
        check_interval=3600.0,
    ).start()
    # The fake streams open at once; wait for that, so the test's own stream changes come last.
    wait_until(lambda: all(s.connected for s in spout.subscriptions))
    return spout, cluster, calls


def _root_on(spout, shard, message_id):
    while True:
        (root,) = spout.emit("r", message_id).message_id.roots
        if root % spout.cluster.shard_count == shard:
            return root
        # Not the shard we want: settle it as its acker's stream would, and draw again.
        acked = np.array([int(Outcome.ACKED)], np.int32)
        spout._on_outcomes(root % spout.cluster.shard_count, np.array([root], np.uint64), acked, np.zeros(1, np.uint64))


def test_backstop_stands_still_while_the_shard_stream_is_down(clock):
    """A down stream pauses only its shard's backstop; the outage is added to the deadline after it heals."""
    spout, _, _ = _spout(clock)
    try:
        on_0 = _root_on(spout, 0, "zero")
        on_1 = _root_on(spout, 1, "one")
        spout._on_stream_state(0, False)
        clock.advance(6.0)
        assert spout.stats.streams_down == 1
        spout._on_stream_state(0, True)  # healed after 6 s: shard 0's deadline moves 6 s later
        clock.advance(4.5)
        assert spout.check_timeouts() == 1  # shard 1's record only
        assert on_0 in spout._pending and on_1 not in spout._pending
        clock.advance(5.4)
        assert spout.check_timeouts() == 0
        clock.advance(0.2)
        assert spout.check_timeouts() == 1
        assert spout.stats.backstop_paused_seconds == pytest.approx(6.0) and spout.stats.lost == 2
    finally:
        spout.close()


def test_a_stream_that_never_returns_pauses_at_most_one_timeout(clock):
    """The pause per outage is capped at the backstop timeout, so a dead stream still ends in LOST."""
    spout, _, calls = _spout(clock, timeout=4.0, shards=1)
    try:
        spout.emit("r", "m")
        spout._on_stream_state(0, False)
        clock.advance(7.9)
        assert spout.check_timeouts() == 0
        clock.advance(0.2)
        assert spout.check_timeouts() == 1
        assert spout.stats.lost == 1
    finally:
        spout.close()
    assert calls == [("m", Outcome.LOST)]


def test_client_keepalive_is_within_what_the_server_permits_and_notices_a_dead_peer_in_seconds():
    """Client pings no more often than the server accepts (no too_many_pings), and gives up on silence fast."""
    server = dict(grpc_options.server_options())
    client = dict(grpc_options.client_options())
    assert client["grpc.keepalive_time_ms"] > server[grpc_options.MIN_RECV_PING_INTERVAL_OPTION]
    assert client["grpc.keepalive_time_ms"] + client["grpc.keepalive_timeout_ms"] <= 10_000
    assert client["grpc.http2.ping_timeout_ms"] <= 5_000  # a half-open connection with traffic on it
    assert client["grpc.enable_retries"] == 0  # the client alone decides what may be repeated


def test_reconnect_backoff_is_configurable_and_checked():
    """ClusterClient's reconnect_backoff reaches the channel options; a max below the initial is refused."""
    client = ClusterClient(["127.0.0.1:1"], verify=False, reconnect_backoff=(0.25, 3.0))
    try:
        options = dict(client._channel_options)
        assert options["grpc.initial_reconnect_backoff_ms"] == 250
        assert options["grpc.max_reconnect_backoff_ms"] == 3000
    finally:
        client.close()
    with pytest.raises(ValueError, match="reconnect backoff"):
        ClusterClient(["127.0.0.1:1"], verify=False, reconnect_backoff=(2.0, 1.0))


def test_buffer_knows_its_retry_safety_without_reading_the_request():
    """OpBuffer.retry_safe agrees with retry_safe(request) for scalar and column buffers, with and without a key."""
    columns = OpBuffer()
    columns.add_columns(ACK_KIND, np.array([5], np.uint64), np.array([3], np.uint64))
    keyed_columns = OpBuffer()
    keyed_columns.add_columns(ACK_KIND, np.array([5], np.uint64), np.array([3], np.uint64), dedup_key=8)
    zero_fold = OpBuffer()
    zero_fold.ack(7, 3)
    zero_fold.ack(7, 3)  # folds to 0: not sent at all
    idempotent = OpBuffer()
    idempotent.fail(3)
    for buf in (_buffer(), columns, keyed_columns, zero_fold, idempotent):
        for key in (0, 77):
            assert buf.retry_safe(key) == retry_safe(buf.to_request(key)), (buf, key)
    assert not _buffer().retry_safe(0) and not columns.retry_safe(0) and keyed_columns.retry_safe(0)
