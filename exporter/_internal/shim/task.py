"""`exporter.task()`, `tool()`, `guardrail()`: agent tasks, their steps and their spans.

A task is a ContextVar value, so it follows the code: every LLM call made inside the block
(SDK patch or `track()`), in asyncio tasks created there (`gather`) or in threads handed its
context (`asyncio.to_thread`, `contextvars.copy_context().run`), is a step of it, and `tool()` /
`guardrail()` blocks inside it are its spans. A thread pool that does not copy the context can
use the task object: `t.tool("search")`. Parallel blocks are recognised by their stamps: they
overlap. While it runs a task only appends one record per step or block (a list append, safe
across threads); at its end `tasks.summarize` computes its figures and the recorder records
them under one lock. A nested task records its own figures, then adds its records to the
outer task's.

`task(name, deadline=seconds)` puts a deadline in force (the earlier of it and one already in
force: an outer task's, or an inbound request's, see deadline.py); `sdk_timeout=True` also
passes the time left as the timeout of each SDK call made inside it.

With an OpenTelemetry TracerProvider, a task is one span (`invoke_agent <name>`) parenting
its calls' spans, its tool spans (`execute_tool <name>`) and guardrail spans, with the task's
figures as attributes (docs/tracing.md). Nothing here raises into the caller: a failure inside
the exporter is a counted drop; an exception from the block passes through untouched (it only
sets the outcome).
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from time import perf_counter_ns
from types import TracebackType
from typing import Any

from .. import names, runtime
from ..record import tasks
from ..record.outcome import outcome_of
from ..record.timeline import CallTimeline, Derived
from . import deadline as deadlines, otel

_TASK: ContextVar["Task | None"] = ContextVar("ttft_exporter_task", default=None)
#: Steps and blocks one task keeps. A task left unfinished (a thread whose ContextVar is never
#: reset) collects every later call of its context: past this it keeps nothing more (counted
#: once, `reason="task_overflow"`), so it holds at most this many records.
MAX_RECORDS = 4096
#: Shortest timeout `sdk_timeout` passes (a deadline already passed still gets a request out).
MIN_TIMEOUT = 0.001


def current() -> "Task | None":
    """The innermost task running here, or None."""
    return _TASK.get()


def _tracing(state: runtime.State | None) -> bool:
    """Spans are made: the app traces (checked first: the common answer is no) and the config
    allows it. ~1 µs: OpenTelemetry looks its provider's variable up in the environment."""
    return otel.tracing() and (state or runtime.state()).config.otel.traces


def _in_recording_span() -> bool:
    """A recording OpenTelemetry span is current here, and the config allows spans."""
    return otel.recording_span() and runtime.state().config.otel.traces


class Task:
    """One running agent task: what its steps and blocks reported, its deadline (a stamp)."""

    __slots__ = ("name", "start", "deadline", "sdk_timeout", "steps", "works", "_parent",
                 "_span", "_state", "_finished", "_overflowed")

    def __init__(self, name: str, sdk_timeout: bool, parent: "Task | None"):
        self._state = runtime.state()
        self.name = name
        self.start = perf_counter_ns()
        self.deadline: int | None = None
        self.sdk_timeout = sdk_timeout
        self.steps: list[tasks.Step] = []
        #: (kind, start, end) of each tool and guardrail block: tasks.Work's fields, appended
        #: as a plain tuple (a NamedTuple costs ~0.5 µs to build; this is every block's path).
        self.works: list[tuple[str, int, int]] = []
        self._parent = parent
        self._span: otel.TaskSpan | None = None
        self._finished = False
        self._overflowed = False

    def tool(self, name: str) -> "Block":
        """A tool block of this task (from any thread)."""
        return Block(names.KIND_TOOL, name, self)

    def guardrail(self, name: str) -> "Block":
        """A guardrail block of this task (from any thread)."""
        return Block(names.KIND_GUARDRAIL, name, self)

    def remaining(self) -> float | None:
        """Seconds left before this task's deadline (0.0 once passed), or None without one."""
        if self.deadline is None:
            return None
        return max(0, self.deadline - perf_counter_ns()) / 1e9

    # --- what the rest of the shim calls ------------------------------------------------------

    def add_step(self, t: CallTimeline, d: Derived) -> None:
        """An LLM call of this task ended (manual.Call.finish)."""
        if self._room(1):
            self.steps.append(tasks.step_of(t, d))

    def add_work(self, kind: str, start: int, end: int) -> None:
        """A tool or guardrail block of this task ended (a block outliving its task: dropped)."""
        if self._room(1):
            self.works.append((kind, start, end))

    def _room(self, n: int) -> bool:
        """This running task can keep `n` more records (MAX_RECORDS; an overflow counted once).
        """
        if self._finished:
            return False
        if len(self.steps) + len(self.works) + n <= MAX_RECORDS:
            return True
        if not self._overflowed:
            self._overflowed = True
            self._state.recorder.count_drop(names.DROP_TASK_OVERFLOW)
        return False

    def limit(self, options: Any) -> None:
        """With `sdk_timeout`, cap an SDK request's timeout at the time left (never raises)."""
        if self.deadline is None:
            return
        left = max(MIN_TIMEOUT, (self.deadline - perf_counter_ns()) / 1e9)
        try:
            timeout = getattr(options, "timeout", None)
            if timeout.__class__ in (int, float) and timeout <= left:
                return
            options.timeout = left
        except Exception:  # options the SDK will not let us change: the call goes as it was
            self._count_drop()

    def open(self, seconds: Any) -> None:
        """Start: the deadline in force, the span. Called by `task.__enter__`."""
        try:
            own = None if seconds is None else self.start + int(float(seconds) * 1e9)
        except Exception:  # not a number of seconds: no deadline of its own, counted
            own = None
            self._state.recorder.count_drop(names.DROP_BAD_VALUE)
        now = deadlines.current()
        self.deadline = own if now is None or (own is not None and own < now) else now
        if _tracing(self._state):
            try:
                self._span = otel.TaskSpan(names.OP_INVOKE_AGENT, self.name,
                                           {names.ATTR_AGENT_NAME: str(self.name)})
            except Exception:  # the app's tracer provider failed: measure without a span
                self._count_drop()

    def finish(self, exc: BaseException | None) -> None:
        """End once: summarize, end the span, record, hand the records to an outer task."""
        if self._finished:
            return
        self._finished = True
        end = perf_counter_ns()
        summary = None
        try:
            summary = tasks.summarize(self.name, self.start, end, self.deadline,
                                      outcome_of(exc), list(self.steps),
                                      [tasks.Work(*w) for w in self.works])
        except Exception:
            self._count_drop()
        if self._span is not None:
            try:
                self._span.end(exc, None if summary is None else _attributes(summary))
            except Exception:
                self._count_drop()
        if summary is not None:
            self._state.recorder.record_task(summary)
        parent = self._parent
        if parent is not None and parent._room(len(self.steps) + len(self.works)):
            parent.steps.extend(self.steps)
            parent.works.extend(self.works)

    def _count_drop(self) -> None:
        self._state.recorder.count_drop(names.DROP_INTERNAL)


def _attributes(s: tasks.TaskSummary) -> dict[str, Any]:
    """The task's figures as span attributes (seconds, counts)."""
    p = names.ATTR_TASK_PREFIX
    out: dict[str, Any] = {
        p + "steps": s.steps, p + "duration": s.duration / 1e6, p + "summed": s.summed / 1e6,
        p + "critical_path": s.critical_path / 1e6, p + "waterfall_tool_calls": s.waterfall_calls,
        p + "deadline": s.deadline, names.ATTR_OUTCOME: s.outcome}
    for kind, value in s.kinds.items():
        out[f"{p}time.{kind}"] = value / 1e6
    if s.deadline != names.DEADLINE_NONE:
        out[p + "late_calls"] = s.late_calls
        out[p + "orphan_tokens"] = s.orphan_tokens
    return out


#: One entry of a `task` object: the task, its ContextVar token, the deadline's token.
_Entry = tuple[Task, Token["Task | None"], Token["int | None"]]


class task:
    """Context manager (sync and async) around one agent task: `with task("answer") as t`.

    Re-entrant by design: each entry is a task of its own, so one object may be entered by
    concurrent blocks (asyncio tasks, threads) or nested. An exit ends the entry that is
    current in its context; one made elsewhere (a generator resumed in another thread) ends
    the latest entry.
    """

    __slots__ = ("_args", "_open")

    def __init__(self, name: str, deadline: float | None = None, *, sdk_timeout: bool = False):
        self._args = (name, deadline, sdk_timeout)
        self._open: list[_Entry] = []

    def __enter__(self) -> Task:
        name, seconds, sdk_timeout = self._args
        t = Task(name, bool(sdk_timeout), _TASK.get())
        t.open(seconds)
        self._open.append((t, _TASK.set(t), deadlines.enter(t.deadline)))
        return t

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        entry = self._exiting()
        if entry is None:
            return
        t, token, deadline_token = entry
        deadlines.leave(deadline_token)
        try:
            _TASK.reset(token)
        except ValueError:  # exited in another context (a generator moved threads)
            pass
        t.finish(exc)

    def _exiting(self) -> _Entry | None:
        """The entry this exit ends, taken off the open ones (None: exited more than entered).
        """
        here = _TASK.get()
        entries = self._open
        for entry in reversed(entries):
            if entry[0] is here:
                break
        else:
            if not entries:
                return None
            entry = entries[-1]
        try:
            entries.remove(entry)
        except ValueError:  # another thread ended it meanwhile
            return None
        return entry

    async def __aenter__(self) -> Task:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


class Block:
    """A tool or guardrail block (sync and async context manager): two stamps and a record."""

    __slots__ = ("_kind", "_name", "_task", "_start", "_span")

    def __init__(self, kind: str, name: str, owner: Task | None = None):
        self._kind = kind
        self._name = name
        self._task = owner
        self._start = 0
        self._span: otel.TaskSpan | None = None

    def __enter__(self) -> "Block":
        owner = self._task
        if owner is None:
            owner = self._task = _TASK.get()
        # In a task, spans iff the task has one (decided once: asking OpenTelemetry for its
        # provider costs more than the rest of the block); outside any task, iff a recording
        # span is current (a request the app traces): one context lookup.
        if (owner._span is not None) if owner is not None else _in_recording_span():
            try:
                if self._kind == names.KIND_TOOL:
                    self._span = otel.TaskSpan(names.OP_EXECUTE_TOOL, self._name,
                                               {names.ATTR_TOOL_NAME: str(self._name)})
                else:
                    self._span = otel.TaskSpan(names.OP_GUARDRAIL, self._name,
                                               {names.ATTR_GUARDRAIL_NAME: str(self._name)})
            except Exception:
                runtime.count_drop()
        self._start = perf_counter_ns()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        end = perf_counter_ns()
        owner = self._task
        if owner is not None:
            owner.add_work(self._kind, self._start, end)
        span, self._span = self._span, None
        if span is not None:
            try:
                span.end(exc)
            except Exception:
                runtime.count_drop()

    async def __aenter__(self) -> "Block":
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


def tool(name: str) -> Block:
    """A tool block of the current task: `with exporter.tool("search"):` (sync or async)."""
    return Block(names.KIND_TOOL, name)


def guardrail(name: str) -> Block:
    """A guardrail block of the current task: `with exporter.guardrail("pii"):`."""
    return Block(names.KIND_GUARDRAIL, name)


def remaining() -> float | None:
    """Seconds left before the deadline in force here (0.0 once passed), or None."""
    return deadlines.remaining()
