"""Shared fixtures for the ledger tests: a fake monotonic clock and the property tree counter."""

from __future__ import annotations

import os
from collections import Counter

import pytest

__all__ = ["FakeClock"]


class FakeClock:
    """A monotonic clock the test moves by hand, so timeouts need no sleeping."""

    def __init__(self, start: float = 1000.0) -> None:
        # Not 0: a ledger must not rely on the clock starting at zero.
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        """Move time forward by ``dt`` seconds (never backwards: the clock is monotonic)."""
        if dt < 0:
            raise ValueError(f"a monotonic clock cannot go back {dt} seconds")
        self.now += dt

    def set(self, t: float) -> None:
        """Move time forward to the absolute time ``t``."""
        self.advance(t - self.now)


@pytest.fixture
def clock() -> FakeClock:
    """A fresh fake clock at t = 1000 s."""
    return FakeClock()


@pytest.fixture(scope="session")
def clock_factory() -> type[FakeClock]:
    """The FakeClock class, for hypothesis tests that need a fresh clock per example."""
    return FakeClock


_TREES_KEY = pytest.StashKey[Counter]()


@pytest.fixture(scope="session")
def trees_checked(request) -> Counter:
    """Per-property count of trees checked, printed in the terminal summary."""
    return request.config.stash.setdefault(_TREES_KEY, Counter())


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Report how many trees each property test covered (the issue asks for >= 20,000 on demand)."""
    counts = config.stash.get(_TREES_KEY, None)
    if counts:
        size = os.environ.get("ACKER_PROPERTY_TREES", "default")
        terminalreporter.write_sep("-", f"ledger properties, ACKER_PROPERTY_TREES={size}")
        for name, n in sorted(counts.items()):
            terminalreporter.write_line(f"{name}: {n} trees")
