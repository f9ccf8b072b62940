"""`exporter.labels()`: route and tenant for every call made inside the block.

A ContextVar, so values follow the code that runs: they nest, each asyncio task sees the values
of the code that created it, and a thread sees them when handed a context
(`contextvars.copy_context().run(...)`). Reading costs one `ContextVar.get()` per call.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from types import TracebackType
from typing import Mapping

_EMPTY: Mapping[str, str] = {}
_current: ContextVar[Mapping[str, str]] = ContextVar("ttft_exporter_labels", default=_EMPTY)


def current() -> Mapping[str, str]:
    """The labels in force here (route, tenant), innermost block winning per key."""
    return _current.get()


class labels:
    """Context manager (sync and async) setting `route` and/or `tenant` for calls inside it."""

    __slots__ = ("_values", "_token")

    def __init__(self, *, route: str | None = None, tenant: str | None = None):
        self._values = {k: v for k, v in (("route", route), ("tenant", tenant)) if v is not None}
        self._token: Token[Mapping[str, str]] | None = None

    def __enter__(self) -> "labels":
        self._token = _current.set({**_current.get(), **self._values})
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        token, self._token = self._token, None
        if token is not None:
            try:
                _current.reset(token)
            except ValueError:  # exited in another context (e.g. a generator moved threads)
                pass

    async def __aenter__(self) -> "labels":
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)
