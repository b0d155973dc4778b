"""The two client rules a restarted replica's catch-up relies on (docs/acker-semantics.md, "Replicated trees").

- Both copies of an ACK carry the same dedup key, so a replica that installs its
  partner's snapshot recognises the copy it holds as already applied.
- A copy for an unreachable replica is skipped only once the other copy was
  *applied*, never merely while the partner is reachable: otherwise a partner
  could apply the other copy after the restarted replica's snapshot was cut,
  and the operation would be on neither copy of the range.
- A replica that fails after applying a copy whose other copy is still on its
  way gets that copy again (its crash may have lost it).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import grpc
from acker_client.apply_stream import StreamStatus
from acker_client.batching import OpBuffer
from acker_client.delivery import DROP_REPLICA, ConnectionMonitor, DeliveryPolicy, _partners_applied, deliver
from acker_client.errors import shard_failure
from acker_client.process import ClientStats


class _Answer:
    """A future answered when the test says so: success, or the error it was given."""

    def __init__(self, error: grpc.RpcError | None = None) -> None:
        self.error = error
        self.ready = threading.Event()

    def result(self, timeout: float | None = None) -> object:
        self.ready.wait()
        if self.error is not None:
            raise self.error
        return SimpleNamespace(applied=1, deduplicated=0, ignored=0)

    def done(self) -> bool:
        return self.ready.is_set()

    def exception(self) -> BaseException | None:
        self.ready.wait()
        return self.error


class _Shard:
    """One shard's Apply: down (every attempt fails at once) or answering when released."""

    def __init__(self, down: bool) -> None:
        self.down = down
        self.attempts = 0
        self.requests: list[bytes] = []
        self.release = threading.Event()
        self.tried = threading.Condition()

    def future(self, request: bytes, timeout: float, wait_for_ready: bool | None = None) -> _Answer:
        with self.tried:
            self.attempts += 1
            self.requests.append(request)
            self.tried.notify_all()
        if self.down:
            answer = _Answer(StreamStatus(grpc.StatusCode.UNAVAILABLE, "connection refused"))
            answer.ready.set()
            return answer
        answer = _Answer()
        threading.Thread(target=lambda: (self.release.wait(), answer.ready.set()), daemon=True).start()
        return answer


def _state(shards: list[_Shard]) -> SimpleNamespace:
    return SimpleNamespace(
        apply_calls=shards,
        lock=threading.Lock(),
        stats=ClientStats(),
        connections=ConnectionMonitor(len(shards)),
        buffers=[OpBuffer() for _ in shards],
    )


def _taken(st: SimpleNamespace, shard: int, root: int, started: float = 1.0) -> OpBuffer:
    """A buffer as the sender takes it: one ACK in it, recorded as taken with the swap."""
    buf = OpBuffer()
    buf.ack(root, 5, dedup_key=77)
    buf.started = started
    st.connections.taken(shard, buf)
    return buf


def test_a_down_replica_is_skipped_only_after_its_partner_applied_the_other_copy():
    """Shard 0 is down and shard 1 has not answered yet: shard 0's batch keeps trying; once shard 1
    applied its copy, shard 0's batch is dropped as covered (reason replica), never raised as lost."""
    down, slow = _Shard(down=True), _Shard(down=False)
    st = _state([down, slow])
    batches = {0: _taken(st, 0, 4), 1: _taken(st, 1, 4)}
    policy = DeliveryPolicy(attempt_deadline=5.0, wait_for_shard=30.0, replicas=2, shard_count=2)
    result: list = []

    def send() -> None:
        result.append(
            deliver(
                st,
                batches,
                policy=policy,
                batch_keys=True,
                failure_of=lambda shard, exc, count, roots: shard_failure(shard, f"shard{shard}", exc, count, roots),
                on_sent=lambda *args: None,
            )
        )

    sender = threading.Thread(target=send)
    sender.start()
    with down.tried:
        # With the rule of "partner reachable" the first failure would already have dropped it.
        assert down.tried.wait_for(lambda: down.attempts >= 3, timeout=30)
    assert not result, "shard 0's copy was skipped before shard 1 applied the other copy"
    slow.release.set()
    sender.join(30)
    (failures,) = result
    assert [(f.shard, f.reason) for f in failures] == [(0, DROP_REPLICA)]
    assert st.connections.applied_before(1, 2.0), "shard 1's applied batch is forgotten"


def _deliver(st: SimpleNamespace, batches: dict, policy: DeliveryPolicy) -> list:
    return deliver(
        st,
        batches,
        policy=policy,
        batch_keys=True,
        failure_of=lambda shard, exc, count, roots: shard_failure(shard, f"shard{shard}", exc, count, roots),
        on_sent=lambda *args: None,
    )


def test_a_replica_that_fails_after_applying_gets_its_copies_again_while_the_partner_lags():
    """Shard 0 applies a copy while shard 1's copy is still on its way; shard 0 then fails (a crash): the copy
    it had applied is sent to it again, and goes on being tried until shard 1 applied the other copy."""
    up, slow = _Shard(down=False), _Shard(down=False)
    up.release.set()
    st = _state([up, slow])
    policy = DeliveryPolicy(attempt_deadline=5.0, wait_for_shard=30.0, replicas=2, shard_count=2)
    partner_copy = _taken(st, 1, 4)
    behind = threading.Thread(target=_deliver, args=(st, {1: partner_copy}, policy))
    behind.start()  # shard 1's copy: not answered until released
    assert _deliver(st, {0: _taken(st, 0, 4)}, policy) == []
    (first,) = up.requests
    up.down = True  # shard 0 is killed: its next batch fails
    later = threading.Thread(target=_deliver, args=(st, {0: _taken(st, 0, 8, started=2.0)}, policy))
    later.start()
    with up.tried:
        assert up.tried.wait_for(lambda: up.requests.count(first) >= 2, timeout=30), "the applied copy was not put back"
    assert st.stats.operations_put_back == 1
    slow.release.set()
    behind.join(30)
    later.join(30)


def test_an_applied_copy_whose_partner_applied_too_is_not_sent_again():
    """Both copies applied: a later failure of the replica puts nothing back."""
    up, partner = _Shard(down=False), _Shard(down=False)
    up.release.set()
    partner.release.set()
    st = _state([up, partner])
    policy = DeliveryPolicy(attempt_deadline=5.0, wait_for_shard=1.0, replicas=2, shard_count=2)
    assert _deliver(st, {0: _taken(st, 0, 4), 1: _taken(st, 1, 4)}, policy) == []
    up.down = True
    (failure,) = _deliver(st, {0: _taken(st, 0, 8, started=2.0)}, policy)
    assert failure.reason == DROP_REPLICA
    assert st.stats.operations_put_back == 0 and len(up.requests) == 2


def test_a_partner_buffering_older_operations_blocks_the_skip():
    """A partner whose own buffer still holds operations from before the batch was taken has not applied them."""
    st = _state([_Shard(down=True), _Shard(down=False)])
    st.buffers[1].ack(4, 5, dedup_key=77)
    st.buffers[1].started = 0.5

    assert not _partners_applied(st, (1,), 1.0)
    st.buffers[1] = OpBuffer()
    assert _partners_applied(st, (1,), 1.0)
    _taken(st, 1, 4)  # taken and not answered: not applied either
    assert not _partners_applied(st, (1,), 1.0)


def test_both_replicas_get_one_dedup_key_for_an_unkeyed_ack(make_ackers, make_client):
    """ack() and ack_columns() without a key: each shard holding the root records the same key."""
    servers = make_ackers(3, replicas=2)
    client = make_client([s.address for s in servers])
    client.init(4, 3, "s")  # shards 1 and 2 keep root 4
    client.init(5, 3, "s")  # shards 2 and 0 keep root 5
    client.flush()
    client.ack(4, 1)
    client.ack_columns([5], [1])
    client.flush()

    def keys(server, root: int) -> tuple[int, ...]:
        snapshot = server.call(lambda: server.ledger.export_snapshot(3, root % 3))
        return next(row[7] for row in snapshot.rows() if row[0] == root)

    assert keys(servers[1], 4) == keys(servers[2], 4) != ()
    assert keys(servers[2], 5) == keys(servers[0], 5) != ()
