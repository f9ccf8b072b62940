"""`exporter.track()`: the manual API, for any client the SDK patches do not cover.

The per-token path is a `perf_counter_ns()` stamp appended to a list; everything else happens
once, when the block exits. Nothing here raises into the caller: a failure inside the exporter
is a counted drop (`ttft_exporter_dropped_total{reason="internal_error"}`), and an exception
from the caller's block passes through untouched (it only sets the outcome).
"""

from __future__ import annotations

from time import perf_counter_ns
from types import TracebackType

from .. import names, runtime
from ..timeline import CallTimeline, outcome_of
from . import context


class Call:
    """One tracked call. Methods are cheap and safe to call in any order, any number of times."""

    __slots__ = ("timeline", "_recorder", "_in_flight", "_finished")

    def __init__(self, model: str, provider: str, route: str | None, tenant: str | None):
        labels = context.current()
        self.timeline = CallTimeline(
            start=perf_counter_ns(), model=model, provider=provider,
            route=route if route is not None else labels.get("route", names.UNKNOWN),
            tenant=tenant if tenant is not None else labels.get("tenant", ""))
        self._recorder = runtime.state().recorder
        self._in_flight = self._recorder.started(model, provider, self.timeline.route)
        self._finished = False

    def dispatched(self) -> None:
        """The request left client-side queueing (pool wait, semaphore) for the connection."""
        self.timeline.dispatched = perf_counter_ns()

    def connected(self) -> None:
        """DNS, TCP and TLS are done (call right after `dispatched()` on a reused connection)."""
        self.timeline.connected = perf_counter_ns()

    def sent(self) -> None:
        """The request body is written."""
        self.timeline.sent = perf_counter_ns()

    def headers(self) -> None:
        """The response headers are read."""
        self.timeline.headers = perf_counter_ns()

    def token(self, kind: str = names.CONTENT) -> None:
        """One token event: output text (`content`), `reasoning` text, or `tool` arguments.

        Any kind other than `reasoning` counts as an answer token.
        """
        self.timeline.token(perf_counter_ns(), kind)

    def usage(self, input: int | None = None, output: int | None = None,
              cached: int | None = None, model: str | None = None) -> None:
        """Token counts from the provider's usage, and the response model when it differs."""
        t = self.timeline
        for attr, value in (("input_tokens", input), ("output_tokens", output),
                            ("cached_input_tokens", cached)):
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                setattr(t, attr, value)
        if model:
            t.model = model

    def abandon(self) -> None:
        """The caller stopped reading before the end of the response."""
        if self.timeline.outcome is None:
            self.timeline.outcome = names.ABANDONED

    def finish(self, exc: BaseException | None = None, *, end: int | None = None) -> None:
        """End the call (idempotent): stamp `end` (now, or the given stamp), classify the
        outcome, record."""
        if self._finished:
            return
        self._finished = True
        try:
            t = self.timeline
            t.end = perf_counter_ns() if end is None else end
            if t.outcome is None or exc is not None:
                t.outcome = outcome_of(exc)
        finally:
            self._recorder.record_call(self.timeline, self._in_flight)


class track:
    """Context manager (sync and async) that measures one call: `with track(model=...) as call`."""

    __slots__ = ("_args", "_call")

    def __init__(self, model: str, provider: str = names.UNKNOWN, *, route: str | None = None,
                 tenant: str | None = None):
        self._args = (model, provider, route, tenant)
        self._call: Call | None = None

    def __enter__(self) -> Call:
        self._call = Call(*self._args)
        return self._call

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._call is not None:
            try:
                self._call.finish(exc)
            except Exception:
                runtime.state().recorder.drops[names.DROP_INTERNAL] += 1

    async def __aenter__(self) -> Call:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)
