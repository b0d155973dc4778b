"""Scale test: N trees expire at once on a real acker while health checks and Apply are probed.

The acker runs on a free port with an injected clock, so the expiry happens when
the test moves the clock. A raw Subscribe counts the outcomes. Asserted: every
one of the N TIMED_OUT outcomes reaches the subscribed spout (even though N is
far above ``--retain-outcomes``), none is dropped, and every health check and
Apply during the expiry is answered. Latencies are recorded, not asserted
(``acker-bench --mode mass-timeout`` reports them). N is ``ACKER_MASS_TIMEOUT_TREES``
(default 20,000; the 1M figure on demand).
"""

from __future__ import annotations

import logging
import os

from acker_bench.mass_timeout import run_mass_timeout

TREES = int(os.environ.get("ACKER_MASS_TIMEOUT_TREES", "20000"))


def test_mass_timeout_delivers_every_outcome_and_keeps_answering(engine, record_property, caplog):
    caplog.set_level(logging.WARNING, logger="acker_service")
    # Retention far below N: the burst must wait for the stream, not be evicted by the count bound.
    result = run_mass_timeout(TREES, engine, retain_outcomes=max(1, TREES // 20))
    summary = result.summary()
    for key in ("health_worst_ms", "health_p99_ms", "apply_worst_ms", "expiry_seconds"):
        record_property(key, summary[key])
    print(summary)
    assert result.outcomes_delivered == TREES, summary
    assert result.outcomes_dropped == 0, summary
    assert result.health_checks > 0 and result.health_failed == 0, summary
    assert result.applies > 0 and result.apply_failed == 0, summary
    if TREES >= 10_000:  # the operator's log line (docs/operations.md, "Mass timeouts")
        assert any(f"mass timeout: {TREES} trees timed out" in r.getMessage() for r in caplog.records)
