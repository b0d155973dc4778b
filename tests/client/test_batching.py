"""OpBuffer: folding, idempotent dedupe, and an encoding the acker's own validator accepts."""

from __future__ import annotations

from functools import reduce
from operator import xor

from acker_client.batching import ACK, FAIL, INIT, RESET_TIMEOUT, OpBuffer
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from acker_service.batch import Batch, validate_batch
from acker_service.ledger import UNLIMITED
from acker_service.reference_ledger import ReferenceLedger


def _ops(request):
    keys = list(request.dedup_keys) or [0] * len(request.kinds)
    return list(zip(request.kinds, request.root_ids, request.values, keys))


def _validate(request, shard_count=1):
    batch = Batch.of(
        request.kinds, request.root_ids, request.values, request.dedup_keys, request.spouts, request.spout_index
    )
    validate_batch(batch, shard_index=0, shard_count=shard_count, max_batch=65536)


def test_acks_for_one_root_fold_into_one_operation():
    """Many acks for one root in a batch become one ACK carrying their xor."""
    buf = OpBuffer()
    values = [3, 5, 9, 17, 1 << 63]
    for v in values:
        buf.ack(7, v)
    request = buf.to_request()
    assert _ops(request) == [(ACK, 7, reduce(xor, values), 0)]
    assert (buf.size, buf.added, buf.folded) == (1, 5, 4)


def test_keyed_acks_fold_per_key():
    """Acks fold per (root, dedup key): different keys stay separate operations, each with its key."""
    buf = OpBuffer()
    buf.ack(7, 1, dedup_key=10)
    buf.ack(7, 2, dedup_key=10)
    buf.ack(7, 4, dedup_key=11)
    buf.ack(7, 8)
    assert sorted(_ops(buf.to_request())) == [(ACK, 7, 3, 10), (ACK, 7, 4, 11), (ACK, 7, 8, 0)]


def test_acks_folding_to_zero_are_not_sent():
    """An ack pair that cancels out changes no checksum and is not sent."""
    buf = OpBuffer()
    buf.ack(7, 5)
    buf.ack(7, 5)
    buf.ack(8, 1)
    assert _ops(buf.to_request()) == [(ACK, 8, 1, 0)]


def test_fail_and_reset_sent_once_and_fail_before_ack():
    """FAIL and RESET_TIMEOUT are idempotent and sent once; FAILs precede ACKs so a fail wins in a batch."""
    buf = OpBuffer()
    buf.ack(7, 5)
    buf.reset_timeout(7)
    buf.fail(7)
    buf.fail(7)
    buf.reset_timeout(7)
    buf.init(9, 4, "s")
    assert [k for k, *_ in _ops(buf.to_request())] == [INIT, FAIL, ACK, RESET_TIMEOUT]
    assert buf.init_roots() == (9,)


def test_single_spout_omits_optional_arrays():
    """With one spout and no keys, dedup_keys and spout_index stay empty (smaller requests)."""
    buf = OpBuffer()
    buf.init(9, 4, "s")
    buf.ack(9, 4)
    request = buf.to_request()
    assert list(request.spouts) == ["s"]
    assert len(request.spout_index) == 0 and len(request.dedup_keys) == 0
    _validate(request)


def test_several_spouts_get_an_index_per_operation():
    """Inits of two spouts in one batch carry one spout index per operation, accepted by the acker's validator."""
    buf = OpBuffer()
    buf.init(9, 4, "a")
    buf.init(10, 4, "b")
    buf.ack(11, 1, dedup_key=5)
    buf.init(12, 4, "a")
    request = buf.to_request()
    _validate(request)
    spouts = list(request.spouts)
    named = [spouts[i] for k, i in zip(request.kinds, request.spout_index) if k == INIT]
    inits = [r for k, r in zip(request.kinds, request.root_ids) if k == INIT]
    assert dict(zip(inits, named)) == {9: "a", 10: "b", 12: "a"}


op = st.one_of(
    st.tuples(st.just("ack"), st.integers(1, 6), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("fail"), st.integers(1, 6), st.just(0)),
    st.tuples(st.just("reset"), st.integers(1, 6), st.just(0)),
)


def _buffer(calls) -> OpBuffer:
    buf = OpBuffer()
    for kind, root, value in calls:
        if kind == "init":
            buf.init(root, value, "s")
        elif kind == "ack":
            buf.ack(root, value)
        elif kind == "fail":
            buf.fail(root)
        else:
            buf.reset_timeout(root)
    return buf


def _outcomes(requests) -> tuple[dict, int]:
    ledger = ReferenceLedger(message_timeout=30.0, clock=lambda: 0.0)
    ended = {}
    for request in requests:
        _validate(request)
        for res in ledger.apply(request.SerializeToString(), UNLIMITED).ended.resolutions():
            assert res.root not in ended, "a tree ended twice"
            ended[res.root] = res.outcome
    return ended, ledger.pending_trees


@settings(max_examples=200, deadline=None)
@given(st.lists(op, max_size=60), st.data())
def test_folded_batch_ends_trees_like_the_unfolded_calls(ops, data):
    """Sending the calls as one folded batch ends the same trees the same way as sending them one by one."""
    roots = sorted({r for _, r, _ in ops} | {1})
    init_values = {r: data.draw(st.integers(1, 2**64 - 1)) for r in roots}
    # Closing acks complete some trees (those not failed); the others stay pending.
    closing = []
    for r in data.draw(st.lists(st.sampled_from(roots), unique=True)):
        closing.append(("ack", r, init_values[r] ^ reduce(xor, [v for k, rr, v in ops if k == "ack" and rr == r], 0)))
    calls = [("init", r, init_values[r]) for r in roots] + ops + closing
    # Rule out 64-bit collisions (a random ack cancelling a tree early): the
    # property is about folding, and the ledger would rightly ack those trees.
    for r in roots:
        val = init_values[r]
        for k, rr, v in ops:
            if k == "ack" and rr == r:
                val ^= v
                assume(val != 0)
    folded = _outcomes([_buffer(calls).to_request()])
    stepwise = _outcomes([_buffer([c]).to_request() for c in calls])
    assert folded == stepwise
