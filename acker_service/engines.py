"""The ledger engines a server can run: ``native`` (the Rust core, default) and ``reference``.

Both implement the one :class:`~acker_service.ledger.Ledger` contract; this
module only picks one by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .config import ENGINES
from .ledger import Ledger

__all__ = ["ENGINES", "DEFAULT_ENGINE", "new_ledger"]

DEFAULT_ENGINE = "native"


def new_ledger(
    engine: str,
    message_timeout: float,
    buckets: int = 3,
    clock: Callable[[], float] = time.monotonic,
    *,
    timeout_mode: str = "fixed",
    max_tree_lifetime: float = 0.0,
) -> Ledger:
    """A ledger of the named engine (``native`` needs the built extension ``acker_service._native``).

    ``timeout_mode`` and ``max_tree_lifetime`` (0: no cap) are the progress-timeout rules (tree_info.py).
    """
    if engine == "native":
        from .native_ledger import NativeLedger  # only this engine needs the extension

        return NativeLedger(
            message_timeout, buckets, clock, timeout_mode=timeout_mode, max_tree_lifetime=max_tree_lifetime
        )
    if engine == "reference":
        from .reference_ledger import ReferenceLedger

        return ReferenceLedger(
            message_timeout, buckets, clock, timeout_mode=timeout_mode, max_tree_lifetime=max_tree_lifetime
        )
    raise ValueError(f"unknown ledger engine {engine!r}; choose one of {', '.join(ENGINES)}")
