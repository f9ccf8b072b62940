"""The checks of exporter/_internal/compat.py, with the standard library only, so that
tests/test_pythons.py runs them under any Python installed here, the package not installed:
`python compat_checks.py path/to/compat.py` checks the functions compat chose on that Python.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta, timezone
from typing import Any

#: RFC 3339 times as diagnose's `--at` takes them ("Z" already replaced), and their instants.
TIMES = {
    "2024-05-01T12:00:00+00:00": datetime(2024, 5, 1, 12, tzinfo=timezone.utc),
    "2024-05-01T12:00:00.5+00:00": datetime(2024, 5, 1, 12, 0, 0, 500_000, timezone.utc),
    "2024-05-01T12:00:00.123+00:00": datetime(2024, 5, 1, 12, 0, 0, 123_000, timezone.utc),
    "2024-05-01T12:00:00.123456789+00:00": datetime(2024, 5, 1, 12, 0, 0, 123_456,
                                                     timezone.utc),
    "2024-05-01T14:00:00.25+02:00": datetime(2024, 5, 1, 14, 0, 0, 250_000,
                                              timezone(timedelta(hours=2))),
}

Timeout = Callable[[float], AbstractAsyncContextManager[None]]


def check_timeout(timeout: Timeout) -> None:
    """`async with timeout(s)`: the body runs when in time; raises the builtin TimeoutError
    when the time is up; a cancellation from elsewhere stays one; no timer outlives the block."""

    async def in_time() -> str:
        async with timeout(30):
            await asyncio.sleep(0)
            return "done"

    async def too_slow() -> None:
        async with timeout(0.05):
            await asyncio.sleep(30)

    async def cancelled_from_outside() -> None:
        async def body() -> None:
            async with timeout(30):
                await asyncio.sleep(30)

        task = asyncio.ensure_future(body())
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return
        raise AssertionError("a cancellation from outside was not a cancellation")

    async def no_timer_left() -> None:
        async with timeout(0.02):
            pass
        await asyncio.sleep(0.1)  # a timer left behind would cancel the task here

    assert asyncio.run(in_time()) == "done"
    try:
        asyncio.run(too_slow())
    except TimeoutError:
        pass
    else:
        raise AssertionError("a body slower than its timeout ran to its end")
    asyncio.run(cancelled_from_outside())
    asyncio.run(no_timer_left())


def check_fromisoformat(fromisoformat: Callable[[str], datetime]) -> None:
    for text, instant in TIMES.items():
        assert fromisoformat(text) == instant, (text, fromisoformat(text), instant)


def load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("compat_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    compat = load(sys.argv[1])
    check_timeout(compat.timeout)
    check_fromisoformat(compat.fromisoformat)
    print(f"compat ok on {sys.version.split()[0]}")
