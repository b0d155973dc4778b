"""Executors ride out an outage shorter than the message timeout: a cut, a paused acker, a killed replica.

Real acker processes, the session's local Spark, the demo's word count with
injected failures (so the round has trees failed by the job itself, as the
demo's flaky records). Every client reaches the ackers through a
:class:`~tests.blips.proxy.BlipProxy`; the cut resets and refuses only the
executors' connections (other processes than this one), so the driver keeps
its outcome streams, as when one worker's network is cut. The outage starts
once the job's last stage fails its first tree and lasts well under the
message timeout: the records replayed beyond a fault-free run's must stay
under 1% and the sink exact (:mod:`tests.blips.spark_outage`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from acker_spark import close_clients

from acker_service.process_cluster import ProcessCluster
from tests.blips.spark_outage import run_outage

# Two SourcePipeline runs per test (the fault-free one once per module) on a shared 2-core machine.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

RECORDS = 3_000
MESSAGE_TIMEOUT = 12.0
OUTAGE_SECONDS = 3.5
FAIL_PERCENT = 0.5
# SourcePipeline's hang_grace, scaled down with the cut (5 s against a 10 s cut by default): the outage
# outlasts it, as a 10 s cut outlasts the default. The timeout stays long: on a loaded 2-core machine
# trees waiting between stages time out at 8 s even without a fault.
HANG_GRACE = 2.0
# The fault starts this long after the run's first FAILED outcome: at once, because on a quiet machine a warm run of
# these 3,000 records takes 2 s, and a fault that comes after its end proves nothing (the test says so).
FAULT_DELAY = 0.0


def _ackers(replicas: int) -> ProcessCluster:
    """Three acker processes on loopback, keeping every tree on ``replicas`` of them."""
    return ProcessCluster(3, message_timeout=MESSAGE_TIMEOUT, extra_args=("--replicas", str(replicas)))


@pytest.fixture(scope="module")
def baseline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fault-free run's figures (the injected failures are drawn per record and attempt: the same every run)."""
    with ProcessCluster(3, message_timeout=MESSAGE_TIMEOUT) as cluster:
        figures = run_outage(
            spark,
            cluster,
            tmp_path_factory.mktemp("clean"),
            records=RECORDS,
            fault="none",
            seconds=0,
            fail_percent=FAIL_PERCENT,
            hang_grace=HANG_GRACE,
        )
    close_clients()
    assert figures["error"] is None and figures["sink_exact"], figures
    return figures


def _check(run: dict[str, Any], baseline: dict[str, Any]) -> None:
    print(json.dumps({"baseline": baseline, "run": run}))  # the figures, shown with -s
    assert run["error"] is None, run
    # It began inside the run (a killed replica may not be back before the run ends: the partner serves it).
    assert run["outage_began_at"] is not None and run["outage_began_at"] < run["run_seconds"], (
        f"the outage did not fall inside the run: {run}"
    )
    assert run["sink_exact"] and run["acked"] == run["emitted"] == RECORDS, run
    extra = run["replayed"] - baseline["replayed"]
    # The injected failures are drawn per record key, and a key names its file, which is another temp folder
    # in each run: the fault-free count itself varies between runs (96 to 132 seen, a Poisson spread of about
    # its square root). The bound is 1% of the records beyond that spread (three standard deviations);
    # the failure it guards against replayed 94% of the records.
    noise = 3 * math.sqrt(max(baseline["replayed"], 1))
    assert extra <= RECORDS // 100 + noise, (
        f"{extra} replays beyond the fault-free run's {baseline['replayed']} (allowed {RECORDS // 100} + {noise:.0f}"
        f" for the draw's spread): {run}"
    )


# (fault, replicas, what it is): each outage lasts OUTAGE_SECONDS, well under the 12 s timeout.
OUTAGES = [
    pytest.param("cut", 1, id="executors-cut"),  # the executors' connections reset and refused
    pytest.param("pause", 1, id="acker-paused"),  # acker 1 stopped (SIGSTOP), then continued
    pytest.param("kill", 2, id="replica-killed"),  # acker 1 kill -9ed, restarted later: it catches up from its partner
]


@pytest.mark.chaos
@pytest.mark.parametrize(("fault", "replicas"), OUTAGES)
def test_an_outage_shorter_than_the_timeout_replays_nothing_more(
    spark: Any, baseline: dict[str, Any], tmp_path: Path, fault: str, replicas: int
) -> None:
    """An outage of 3.5 s mid-run (12 s timeout): the tasks ride it out, nothing replays beyond the fault-free run."""
    with _ackers(replicas) as ackers:
        try:
            run = run_outage(
                spark,
                ackers,
                tmp_path / fault,
                records=RECORDS,
                fault=fault,
                seconds=OUTAGE_SECONDS,
                fail_percent=FAIL_PERCENT,
                hang_grace=HANG_GRACE,
                delay=FAULT_DELAY,
            )
        finally:
            close_clients()
    if fault == "cut":
        assert run["connections_refused"] > 0, f"the cut reached no executor connection: {run}"
    _check(run, baseline)
