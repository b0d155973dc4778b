"""Ids, MessageId and TrackedTuple: non-zero ids, immutability, compact pickling."""

from __future__ import annotations

import pickle

import acker_client
import pytest
from acker_client import MessageId, RandomEdgeIds, TrackedTuple, new_id
from acker_client import ids as ids_module


def test_new_id_redraws_zero(monkeypatch):
    """A zero draw from the CSPRNG is redrawn, because 0 means "complete" to the acker."""
    draws = iter([0, 0, 42])
    monkeypatch.setattr(ids_module.secrets, "randbits", lambda bits: next(draws))
    assert new_id() == 42


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
