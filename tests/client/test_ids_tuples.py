"""Ids, MessageId and TrackedTuple: non-zero ids, immutability, compact pickling."""

from __future__ import annotations

import pickle

import acker_client
import pytest
from acker_client import MessageId, RandomEdgeIds, TrackedTuple, new_id
from acker_client import ids as ids_module


def test_new_id_never_returns_zero(monkeypatch):
    """Zeros in a block drawn from the CSPRNG are skipped, because 0 means "complete" to the acker."""
    import struct

    blocks = iter([bytes(8 * 1024), struct.pack("<1024Q", *([0] * 1023 + [42])), struct.pack("<1024Q", *range(1024))])
    monkeypatch.setattr(ids_module, "_random_bytes", lambda size: next(blocks))
    monkeypatch.setattr(ids_module, "_pool", [])
    assert [new_id() for _ in range(3)] == [42, 1023, 1022]


def test_forked_child_draws_its_own_ids():
    """A forked child starts with an empty pool: it never hands out the ids its parent still holds."""
    import os

    new_id()  # the parent now holds the rest of a block
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.write(write, new_id().to_bytes(8, "little") + len(ids_module._pool).to_bytes(8, "little"))
        os._exit(0)
    os.waitpid(pid, 0)
    data = os.read(read, 16)
    child_id, child_pool = int.from_bytes(data[:8], "little"), int.from_bytes(data[8:], "little")
    assert child_id not in ids_module._pool and child_id != new_id()
    assert child_pool == 1023  # the child read a block of its own and took one id


def test_new_id_is_64_bit_and_varied():
    """Ids are non-zero 64-bit values and do not repeat in a sample."""
    sample = [new_id() for _ in range(10_000)]
    assert all(0 < i < 1 << 64 for i in sample)
    assert len(set(sample)) == len(sample)
    assert max(sample) >= 1 << 60  # uses the high bits too


def test_random_edge_ids_ignores_arguments():
    """RandomEdgeIds gives a fresh id for the same anchor and ordinal."""
    source = RandomEdgeIds()
    t = TrackedTuple("v", MessageId.single(1, 2))
    assert source.edge_id(t, 0) != source.edge_id(t, 0)
    assert isinstance(source, acker_client.EdgeIdSource)


def test_message_id_mapping_and_equality():
    """MessageId behaves as an immutable mapping, equal and hashable by content."""
    m = MessageId({5: 9, 7: 11})
    assert m[5] == 9 and m.get(7) == 11 and m.get(8) is None
    assert set(m.roots) == {5, 7} and len(m) == 2 and 5 in m
    assert m == MessageId([(7, 11), (5, 9)])
    assert hash(m) == hash(MessageId({7: 11, 5: 9}))
    assert m != MessageId.single(5, 9)
    assert not MessageId.EMPTY and len(MessageId.EMPTY) == 0
    with pytest.raises(AttributeError):
        m.extra = 1


@pytest.mark.parametrize("bad", [{0: 1}, {1 << 64: 1}, {-3: 1}, {5: -1}, {5: 1 << 64}])
def test_message_id_rejects_bad_ids(bad):
    """Root ids must be non-zero 64-bit values and edge ids 64-bit values."""
    with pytest.raises(ValueError):
        MessageId(bad)


def test_message_id_pickles_compactly():
    """A one-root MessageId round-trips through pickle in well under 100 bytes."""
    m = MessageId.single((1 << 64) - 1, (1 << 63) + 5)
    data = pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL)
    assert pickle.loads(data) == m
    assert len(data) < 100


def test_tracked_tuple_pickles_value_and_id_only():
    """out_ack_val, the emit ordinal and the settled flag are per-process and not shipped."""
    t = TrackedTuple({"k": 1}, MessageId.single(3, 4))
    t.out_ack_val, t.emit_ordinal, t.settled = 99, 2, True
    copy = pickle.loads(pickle.dumps(t))
    assert copy.value == {"k": 1} and copy.message_id == t.message_id
    assert (copy.out_ack_val, copy.emit_ordinal, copy.settled) == (0, 0, False)


def test_tracked_tuple_requires_message_id():
    """A plain dict is refused as a message id, so a caller's mix-up fails loudly."""
    with pytest.raises(TypeError):
        TrackedTuple("v", {1: 2})


def test_public_names():
    """Every name in __all__ exists (the contract other components code against)."""
    for name in acker_client.__all__:
        assert hasattr(acker_client, name), name
    assert {"ClusterClient", "Spout", "BoltCollector", "SpoutFull", "ClusterMisconfigured"} <= set(acker_client.__all__)


@pytest.mark.parametrize("ids", [{}, {(1 << 64) - 1: 7}, {3: 4, 5: 6, 1 << 63: (1 << 64) - 1}])
def test_tracked_tuple_round_trips_any_number_of_roots(ids):
    """A TrackedTuple with 0, 1 or 3 roots comes back with the same value and ids, and fresh bookkeeping."""
    t = TrackedTuple(("v", 1), MessageId(ids))
    t.out_ack_val, t.emit_ordinal, t.settled = 5, 1, True
    copy = pickle.loads(pickle.dumps(t, protocol=pickle.HIGHEST_PROTOCOL))
    assert copy.value == ("v", 1) and copy.message_id == MessageId(ids) and dict(copy.message_id.items()) == ids
    assert (copy.out_ack_val, copy.emit_ordinal, copy.settled, copy.anchored) == (0, 0, False, bool(ids))


@pytest.mark.parametrize("ids", [{}, {9: 10}, {3: 4, 5: 6}])
def test_message_id_round_trips_alone(ids):
    """A MessageId pickled on its own comes back equal (the empty one as MessageId.EMPTY itself)."""
    copy = pickle.loads(pickle.dumps(MessageId(ids), protocol=pickle.HIGHEST_PROTOCOL))
    assert copy == MessageId(ids) and hash(copy) == hash(MessageId(ids))
    if not ids:
        assert copy is MessageId.EMPTY


def test_tracked_tuple_pickles_its_ids_flat():
    """In a batch, as Spark pickles them, one root costs about 2 x 11 bytes over an untracked tuple."""
    tracked = [TrackedTuple(i, MessageId.single(new_id() | 1 << 63, new_id() | 1 << 63)) for i in range(1000)]
    untracked = [TrackedTuple(i) for i in range(1000)]
    extra = len(pickle.dumps(tracked, protocol=5)) - len(pickle.dumps(untracked, protocol=5))
    assert extra <= 1000 * 23


def test_pickles_of_the_earlier_format_still_load():
    """A TrackedTuple pickled by the previous release ((value, MessageId) with (root, id) pairs) still loads."""
    old = (
        b"\x80\x04\x95R\x00\x00\x00\x00\x00\x00\x00\x8c\x13acker_client.tuples\x94\x8c\x0cTrackedTuple\x94\x93"
        b"\x94\x8c\x01v\x94h\x00\x8c\tMessageId\x94\x93\x94K\x05K\t\x86\x94K\x07K\x0b\x86\x94\x86\x94\x85\x94R"
        b"\x94\x86\x94R\x94."
    )
    t = pickle.loads(old)
    assert t.value == "v" and t.message_id == MessageId({5: 9, 7: 11}) and t.out_ack_val == 0


def test_malformed_flat_ids_are_refused():
    """Restoring flat ids of odd length, or with a root listed twice, raises instead of guessing."""
    from acker_client.tuples import _message_id, _tracked

    with pytest.raises(ValueError):
        _tracked("v", 1, 2, 3)
    with pytest.raises(ValueError):
        _message_id(1, 2, 1, 3)


def test_message_id_view_is_made_once_and_matches_the_ids():
    """A tuple made by the collector's constructor builds its MessageId on first use and keeps it."""
    from acker_client.tuples import tracked

    t = tracked("v", {5: 6})
    assert t.message_id is t.message_id and t.message_id == MessageId.single(5, 6)
    assert MessageId.single(5, 6).roots == (5,)
    with pytest.raises(ValueError):
        MessageId.single(0, 6)
