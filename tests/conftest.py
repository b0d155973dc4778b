"""Suite-wide collection: which tests share an xdist worker when ``make test`` runs them on two.

``make test`` runs ``pytest -n 2 --dist loadgroup``. Tests that share
expensive session or module fixtures must run in one worker, or each worker
would build them again: every test of a top-level folder (``tests/spark``
with its one SparkSession, ``tests/compose`` with its compose project,
``tests/deploy`` with its Prometheus, ...) goes to one group, and the groups
are spread over the workers. Run serially (plain ``pytest``), this changes
nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its top-level folder as its xdist group."""
    for item in items:
        parts = Path(str(item.fspath)).relative_to(_TESTS).parts
        group = parts[0] if len(parts) > 1 else "top"
        item.add_marker(pytest.mark.xdist_group(group))
