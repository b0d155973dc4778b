"""How often and how soon a failed record is delivered again: the one policy every driver of the package uses."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReplayPolicy"]


@dataclass(frozen=True)
class ReplayPolicy:
    """How often and how soon a failed record is delivered again."""

    max_attempts: int = 5  # deliveries in all, the first one included
    backoff_base: float = 0.5  # seconds before the first replay
    backoff_factor: float = 2.0
    backoff_cap: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff_base < 0 or self.backoff_cap < 0 or self.backoff_factor < 1:
            raise ValueError("backoff_base and backoff_cap must be >= 0 and backoff_factor >= 1")

    def delay(self, attempts_made: int) -> float:
        """Seconds to wait before delivery number ``attempts_made + 1``."""
        return min(self.backoff_cap, self.backoff_base * self.backoff_factor ** max(0, attempts_made - 1))
