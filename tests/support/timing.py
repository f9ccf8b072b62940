"""The mark of tests that compare measured times with scripted ones (±10–20 ms).

The provider and the client share one process and, on CI, two cores: a garbage collection of
the whole suite's heap or a GIL hand-off at the wrong moment adds 10–20 ms to one interval.
Marked tests run with the collector paused and a short GIL switch interval (`quiet_process`),
and up to three times; a real mis-stamp (a framing chunk taken for the first token, a gap
counted twice) is off on every run, so it still fails.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

F = TypeVar("F", bound=Callable[..., object])


def timing(test: F) -> F:
    marked = pytest.mark.usefixtures("quiet_process")(test)
    return pytest.mark.flaky(reruns=2, reruns_delay=1)(marked)


@pytest.fixture
def quiet_process() -> Iterator[None]:
    """No collection pauses and 0.5 ms GIL hand-offs (instead of 5 ms) while the test runs."""
    gc.collect()
    gc.disable()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        gc.enable()
