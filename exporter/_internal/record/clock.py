"""Where the recorder reads the time, so tests can move it instead of sleeping.

Call stamps are `time.perf_counter_ns()` values (the shim takes them on the hot path), so the
recorder's monotonic clock is in the same domain: a window slice is chosen from a call's end
stamp, or from this clock when the call has none. The wall clock dates exemplars.
"""

from __future__ import annotations

import time


class Clock:
    """The system clocks. Tests pass a subclass whose time they set."""

    def monotonic_ns(self) -> int:
        return time.perf_counter_ns()

    def time(self) -> float:
        return time.time()


SYSTEM = Clock()

#: Whether `time.perf_counter_ns()` reads CLOCK_MONOTONIC: the C parts that stamp (the chunk
#: loop, the trace extension) read that clock directly, so they are used only where it is true.
PERF_COUNTER_IS_CLOCK_MONOTONIC = (time.get_clock_info("perf_counter").implementation
                                   == "clock_gettime(CLOCK_MONOTONIC)")
