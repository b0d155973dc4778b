"""How often and how soon a failed record is delivered again: the one policy every driver of the package uses."""

from __future__ import annotations

from dataclasses import dataclass

from .job_errors import POISON_ERRORS, error_type

__all__ = ["ReplayPolicy"]


@dataclass(frozen=True)
class ReplayPolicy:
    """How often and how soon a failed record is delivered again."""

    max_attempts: int = 5  # deliveries in all, the first one included
    backoff_base: float = 0.5  # seconds before the first replay
    backoff_factor: float = 2.0
    backoff_cap: float = 30.0
    # Exception types (by class name) that say the record itself is bad: a delivery that failed
    # with one of them as its cause is dead-lettered at once, not replayed. Every other cause
    # (timeouts, connection errors, a reason without an exception) is retried with the backoff.
    dead_letter_at_once: frozenset[str] = POISON_ERRORS
    # A whitelist instead (None: off): only a failure whose cause names one of these exception
    # types is retried; any other exception dead-letters at once. A failure that names no
    # exception (a timeout at the acker, a lost tree, a free-text reason) is still retried.
    retry_on: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff_base < 0 or self.backoff_cap < 0 or self.backoff_factor < 1:
            raise ValueError("backoff_base and backoff_cap must be >= 0 and backoff_factor >= 1")
        for name in ("dead_letter_at_once", "retry_on"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(f"{name} takes a set of exception type names, not the string {value!r}")
            if value is not None and not isinstance(value, frozenset):
                # A list or set is accepted as given; frozen so the policy stays hashable.
                object.__setattr__(self, name, frozenset(value))

    def retries(self, cause: str | None) -> bool:
        """False if ``cause`` (``"Type: message ..."``) names an exception that dead-letters at once.

        With ``retry_on``, an exception outside it dead-letters at once; else one in ``dead_letter_at_once``.
        """
        kind = error_type(cause)
        if kind is None:
            return True
        if self.retry_on is not None:
            return kind in self.retry_on
        return kind not in self.dead_letter_at_once

    def delay(self, attempts_made: int) -> float:
        """Seconds to wait before delivery number ``attempts_made + 1``."""
        return min(self.backoff_cap, self.backoff_base * self.backoff_factor ** max(0, attempts_made - 1))
