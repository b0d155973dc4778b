"""RESET_TIMEOUT notifications: the ledger reports resets of trees whose spout is known."""

from __future__ import annotations

from acker_protocol.wire import OpKind, Outcome

from acker_service.batch import Batch

INIT, ACK, RESET = int(OpKind.INIT), int(OpKind.ACK), int(OpKind.RESET_TIMEOUT)


def test_reset_of_a_known_tree_is_reported_with_its_spout(ledger_cls, clock):
    """A reset of a tree whose init arrived comes back as a TIMEOUT_RESET for that spout, not as an end."""
    ledger = ledger_cls(10.0, clock=clock)
    ledger.apply_batch(Batch.of([INIT], [7], [3], spouts=["s"]))
    clock.advance(2.0)
    result = ledger.apply_batch(Batch.of([RESET], [7], [0]))
    assert [(r.spout, r.root, r.outcome) for r in result.timeout_resets] == [("s", 7, Outcome.TIMEOUT_RESET)]
    assert result.timeout_resets[0].latency_seconds == 2.0
    assert result.resolutions == [] and ledger.pending_trees == 1


def test_reset_before_init_or_of_unknown_root_is_not_reported(ledger_cls, clock):
    """No spout is known for an ack-first entry or an unknown root, so there is nobody to tell."""
    ledger = ledger_cls(10.0, clock=clock)
    result = ledger.apply_batch(Batch.of([ACK, RESET, RESET], [7, 7, 8], [3, 0, 0]))
    assert result.timeout_resets == []
    assert (result.applied, result.ignored) == (2, 1)
