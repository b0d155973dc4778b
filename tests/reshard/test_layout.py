"""The layout state machine (pure): the order of the steps, repeats that are safe, refusals that change nothing, routing."""

from __future__ import annotations

import numpy as np
import pytest

from acker_service.moving.layout import CUT, PREPARED, SERVING, Layout, LayoutMachine, LayoutRefused


def test_prepare_cut_commit_in_order_and_repeats_are_safe():
    """A repeated prepare or commit is a no-op; handoffs are taken only for the prepared epoch."""
    m = LayoutMachine(Layout(0, 3, 1))
    nxt = Layout(1, 4, 1, ("a", "b", "c", "d"))
    m.prepare(nxt)
    m.prepare(nxt)
    assert (m.state, m.moving, m.accepts_handoff(1), m.accepts_handoff(2)) == (PREPARED, True, True, False)
    assert m.awaiting == {0, 2}, "every other old shard hands over, an empty handoff too"
    assert m.start_cut(1) == nxt
    m.mark_cut()
    m.count_moved(5, 7)
    m.source_merged(0)
    with pytest.raises(LayoutRefused, match=r"old shards \[2\]"):
        m.commit(1)
    m.source_merged(2)
    assert (m.state, m.moved_trees, m.moved_entries) == (CUT, 5, 7)
    assert m.commit(1) == nxt and m.commit(1) == nxt
    assert (m.state, m.moving, m.current.owns(5), m.current.owns(6)) == (SERVING, False, True, False)


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        (lambda m: m.commit(1), "cannot commit"),
        (lambda m: m.start_cut(1), "not prepared"),
        (lambda m: m.prepare(Layout(0, 2, 0)), "not above"),
        (lambda m: m.prepare(Layout(1, 2, 2)), "outside"),
        (lambda m: m.prepare(Layout(1, 2, 0, ("a",))), "needs 2 addresses"),
        (lambda m: m.prepare(Layout(1, 2, 0), Layout(1, 3, 0)), "must be older"),
    ],
)
def test_steps_out_of_order_or_bad_layouts_are_refused(step, reason):
    """Each refusal says why and leaves the machine serving its layout."""
    m = LayoutMachine(Layout(0, 3, 0))
    with pytest.raises(LayoutRefused, match=reason):
        step(m)
    assert (m.state, m.current, m.moving) == (SERVING, Layout(0, 3, 0), False)


def test_a_second_change_waits_for_the_first():
    """Preparing another layout mid-change is refused; a drained acker owns nothing and awaits nobody."""
    m = LayoutMachine(Layout(0, 2, 1))
    m.prepare(Layout(1, 1, -1, ("a",)))
    assert m.awaiting == set()
    with pytest.raises(LayoutRefused, match="in progress"):
        m.prepare(Layout(2, 3, 0, ("a", "b", "c")))
    m.start_cut(1)
    m.mark_cut()
    assert not m.commit(1).owns(7)


def _route(m: LayoutMachine, roots: list[int]) -> tuple[list[int], int]:
    r = m.route(np.array(roots, np.uint64))
    return r.source.tolist(), r.refused


def test_route_holds_only_roots_arriving_from_an_old_owner_not_merged_yet():
    """3 -> 4, acker 0: roots it keeps apply, roots arriving wait for their old owner, roots leaving go at the cut."""
    m = LayoutMachine(Layout(0, 3, 0))
    m.prepare(Layout(1, 4, 0, ("a", "b", "c", "d")))
    stay, from_1, from_2, leaving, foreign = 12, 4, 8, 3, 1  # mod 3 / mod 4: 0/0, 1/0, 2/0, 0/3, 1/1
    assert _route(m, [stay, from_1, from_2, leaving]) == ([-1, 1, 2, -1], -1)
    assert _route(m, [stay, foreign]) == ([-1, -1], 1), "a root it owns in neither layout refuses the request"
    m.source_merged(1)
    assert _route(m, [from_1, from_2]) == ([-1, 2], -1), "merged: old shard 1's roots apply now"
    m.start_cut(1)
    m.mark_cut()
    assert _route(m, [stay, leaving]) == ([-1, -1], 1), "after its cut the roots that left are refused"
    assert "moved to shard 3 (d) of the 4 of layout epoch 1" in m.refusal(leaving)


def test_route_of_a_new_acker_holds_every_root_until_its_old_owner_hands_over():
    """An acker new in the layout (index -1 in the old one) awaits every old shard."""
    m = LayoutMachine(Layout(0, 4, 3))
    m.prepare(Layout(1, 4, 3, ("a", "b", "c", "d")), Layout(0, 3, -1, ("a", "b", "c")))
    assert m.awaiting == {0, 1, 2}
    assert _route(m, [3, 7, 11]) == ([0, 1, 2], -1)
    assert _route(m, [3, 4]) == ([0, -1], 1)


def test_route_after_a_manifest_holds_only_roots_whose_entry_is_still_on_its_way():
    """Old shard 1 names roots 4 and 16 as coming; 28 is not: it applies; 4 applies once its chunk merged."""
    m = LayoutMachine(Layout(0, 3, 0))
    m.prepare(Layout(1, 4, 0, ("a", "b", "c", "d")))
    assert _route(m, [4, 16, 28]) == ([1, 1, 1], -1), "no manifest yet: every root of old shard 1 waits"
    m.chunk_merged(1, np.array([16], np.uint64))  # a later chunk first: no manifest, nothing released
    assert _route(m, [4, 16, 28]) == ([1, 1, 1], -1)
    m.chunk_merged(1, np.array([], np.uint64), manifest=np.array([16, 4], np.uint64))
    assert _route(m, [4, 16, 28]) == ([1, -1, -1], -1)
    m.chunk_merged(1, np.array([4], np.uint64))
    assert _route(m, [4, 16, 28]) == ([-1, -1, -1], -1)


def test_a_request_split_in_parts_keeps_every_field_of_each_operation():
    """encode_part of a checked request: the selected operations with their keys, spouts and spout indices."""
    from acker_protocol.apply_codec import encode_part
    from acker_protocol.v1 import acker_pb2

    from acker_service.batch import check_request
    from acker_service.ledger import Limits

    request = acker_pb2.ApplyRequest(
        kinds=[1, 2, 2], root_ids=[3, 4, 5], values=[7, 8, 9], dedup_keys=[0, 11, 12], spouts=["a", "b"],
        spout_index=[1, 0, 0],
    )  # fmt: skip
    batch = check_request(request.SerializeToString(), Limits(max_batch=10))
    part = acker_pb2.ApplyRequest.FromString(encode_part(batch, np.array([True, False, True])))
    assert (list(part.kinds), list(part.root_ids), list(part.values)) == ([1, 2], [3, 5], [7, 9])
    assert (list(part.dedup_keys), list(part.spouts), list(part.spout_index)) == ([0, 12], ["a", "b"], [1, 0])
