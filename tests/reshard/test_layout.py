"""The layout state machine (pure): the order of the steps, repeats that are safe, refusals that change nothing."""

from __future__ import annotations

import pytest

from acker_service.layout import CUT, PREPARED, SERVING, Layout, LayoutMachine, LayoutRefused


def test_prepare_cut_commit_in_order_and_repeats_are_safe():
    """A repeated prepare or commit is a no-op; handoffs are taken only for the prepared epoch."""
    m = LayoutMachine(Layout(0, 3, 1))
    nxt = Layout(1, 4, 1, ("a", "b", "c", "d"))
    m.prepare(nxt)
    m.prepare(nxt)
    assert (m.state, m.holding, m.accepts_handoff(1), m.accepts_handoff(2)) == (PREPARED, True, True, False)
    assert m.start_cut(1) == nxt
    m.cut_done(5, 7)
    assert (m.state, m.moved_trees, m.moved_entries) == (CUT, 5, 7)
    assert m.commit(1) == nxt and m.commit(1) == nxt
    assert (m.state, m.holding, m.current.owns(5), m.current.owns(6)) == (SERVING, False, True, False)


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        (lambda m: m.commit(1), "cannot commit"),
        (lambda m: m.start_cut(1), "not prepared"),
        (lambda m: m.prepare(Layout(0, 2, 0)), "not above"),
        (lambda m: m.prepare(Layout(1, 2, 2)), "outside"),
        (lambda m: m.prepare(Layout(1, 2, 0, ("a",))), "needs 2 addresses"),
    ],
)
def test_steps_out_of_order_or_bad_layouts_are_refused(step, reason):
    """Each refusal says why and leaves the machine serving its layout."""
    m = LayoutMachine(Layout(0, 3, 0))
    with pytest.raises(LayoutRefused, match=reason):
        step(m)
    assert (m.state, m.current) == (SERVING, Layout(0, 3, 0))


def test_a_second_change_waits_for_the_first():
    """Preparing another layout mid-change is refused; a drained acker owns nothing."""
    m = LayoutMachine(Layout(0, 2, 1))
    m.prepare(Layout(1, 1, -1, ("a",)))
    with pytest.raises(LayoutRefused, match="in progress"):
        m.prepare(Layout(2, 3, 0, ("a", "b", "c")))
    m.start_cut(1)
    m.cut_done(0, 0)
    assert not m.commit(1).owns(7)
