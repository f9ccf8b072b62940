"""What differs between the Pythons the package supports (3.10 to 3.13), in one place.

The package's code is written for all of them (`requires-python`, `make pythons` tests each);
where the standard library added what the code needs after 3.10, the newer API is used where it
exists and the small equivalent below runs on 3.10. Standard library only: tests load this
module under each interpreter alone.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime


@asynccontextmanager
async def timeout_before_3_11(seconds: float) -> AsyncIterator[None]:
    """`asyncio.timeout(seconds)` for 3.10: the body is cancelled when the time is up and
    TimeoutError raised in its place; a cancellation from elsewhere stays a cancellation."""
    task = asyncio.current_task()
    assert task is not None, "timeout() is used inside a task"
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    handle = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        yield
    except asyncio.CancelledError:
        if expired:
            raise TimeoutError from None
        raise
    finally:
        handle.cancel()


#: `async with timeout(seconds):` bounds the body's time, raising TimeoutError (the builtin)
#: when it runs out: asyncio.timeout from 3.11 (asyncio.wait_for's TimeoutError is another
#: class on 3.10, and it runs the body as a separate task).
timeout: Callable[[float], AbstractAsyncContextManager[None]] = (
    asyncio.timeout  # type: ignore[attr-defined]
    if sys.version_info >= (3, 11) else timeout_before_3_11)

_FRACTION = re.compile(r"(?<=\d\d:\d\d:\d\d)\.(\d+)")


def fromisoformat_before_3_11(text: str) -> datetime:
    """`datetime.fromisoformat` for 3.10, which takes 3 or 6 digits of a second's fraction
    only: RFC 3339 allows any number (Prometheus writes 3, Go's RFC3339Nano up to 9)."""
    return datetime.fromisoformat(_FRACTION.sub(lambda m: "." + m[1][:6].ljust(6, "0"), text))


#: `fromisoformat(text)`: an ISO 8601 / RFC 3339 time, on every supported Python.
fromisoformat: Callable[[str], datetime] = (
    datetime.fromisoformat if sys.version_info >= (3, 11) else fromisoformat_before_3_11)
