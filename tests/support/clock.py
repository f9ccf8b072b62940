"""A clock the test sets, for the recorder (window slices, exemplar times) instead of sleeping."""

from __future__ import annotations

from exporter._internal.record.clock import Clock


class ManualClock(Clock):
    """Stands still until `advance()`; monotonic in the domain of `perf_counter_ns` stamps."""

    def __init__(self, monotonic_ns: int = 10**12, wall: float = 1_700_000_000.0):
        self.now_ns = monotonic_ns
        self.wall = wall

    def monotonic_ns(self) -> int:
        return self.now_ns

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)
        self.wall += seconds
