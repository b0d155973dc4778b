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
    ) -> _Applied: ...
    def advance(self, now: float, limit: int | None = None) -> tuple[_Columns, bool]: ...
    def seconds_until_rotation(self, now: float) -> float: ...
    def stats(self) -> dict[str, int]: ...
    def roots(self) -> np.ndarray: ...

def decode_apply_request_fields(data: bytes) -> dict[str, list]: ...
def validate_request(data: bytes, shard_index: int, shard_count: int, max_batch: int) -> None: ...
