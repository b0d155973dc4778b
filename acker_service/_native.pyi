"""Type stubs of the native extension (acker_service/native/src/binding.rs)."""

import numpy as np

# (spout names, spout index per outcome, roots, outcome codes, latency in microseconds)
_Columns = tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]
# (applied, deduplicated, ignored, ended trees, timeout-reset notifications)
_Applied = tuple[int, int, int, _Columns, _Columns]

MAX_BUCKETS: int

class NativeCore:
    pending_trees: int
    orphan_entries: int
    buckets: int
    rotation_period: float
    message_timeout: float
    capacity: int
    def __init__(self, message_timeout: float, buckets: int, now: float, seed: int) -> None: ...
    def apply_request(
        self,
        data: bytes,
        now: float,
        shard_index: int,
        shard_count: int,
        max_batch: int,
        expire_limit: int | None = None,
        replicas: int = 1,
    ) -> _Applied: ...
    def advance(self, now: float, limit: int | None = None) -> tuple[_Columns, bool]: ...
    def seconds_until_rotation(self, now: float) -> float: ...
    def stats(self) -> dict[str, int]: ...
    def roots(self) -> np.ndarray: ...
    # Operating a running ledger (issue 21). Tree rows are
    # (root, status, spout name or None, age in microseconds, failed, resets, dedup keys).
    def set_timeout_rules(self, progress: bool, max_lifetime: float) -> None: ...
    def inspect(self, roots: np.ndarray, now: float) -> list[tuple[int, int, str | None, int, bool, int, int]]: ...
    def oldest(self, k: int, now: float) -> list[tuple[int, int, str | None, int, bool, int, int]]: ...
    def age_histogram(self, bounds_us: list[int], now: float) -> tuple[list[int], int]: ...
    def force_fail(self, roots: np.ndarray, now: float) -> _Columns: ...
    def force_fail_spout(self, spout: str, now: float) -> _Columns: ...
    def export_moving(self, count: int, keep: int, now: float) -> tuple: ...
    def export_snapshot(self, count: int, index: int, now: float) -> tuple: ...
    def import_entries(
        self,
        roots: np.ndarray,
        values: np.ndarray,
        spouts: list[str],
        spout_index: np.ndarray,
        ages_us: np.ndarray,
        generations: np.ndarray,
        failed: np.ndarray,
        resets: np.ndarray,
        key_counts: np.ndarray,
        keys: np.ndarray,
        now: float,
    ) -> _Columns: ...

def decode_apply_request_fields(data: bytes) -> dict[str, list]: ...
def validate_request(data: bytes, shard_index: int, shard_count: int, max_batch: int, replicas: int = 1) -> None: ...
