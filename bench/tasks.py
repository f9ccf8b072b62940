"""What agent tasks add (issue #15): per tool or guardrail block, per task, per step.

`python -m bench.tasks [--quick]` prints a markdown section; `run(quick)` returns it for
`python -m bench`. One process, contenders interleaved run by run, medians (min, max):

* a tool block (`with exporter.tool("t"): pass`) inside a running task and outside any, against
  the same loop with an empty block of a plain context manager; with and without an
  OpenTelemetry SDK TracerProvider (spans to a processor that drops them; outside any task,
  inside an app's request span, where such a block is a span);
* a task with no step (enter, summary, one recorder lock, exit) against an empty block;
* a 12-step task of manual `track()` calls against the same 12 calls outside a task: what a
  task adds to its steps (each step's split, the summary's intervals, the recording).

Goal: ≤ 5 µs per tool or guardrail block without tracing.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from typing import Callable

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult, SpanExporter

import exporter
from exporter._internal import runtime
from exporter._internal.shim import otel
from exporter._internal.shim.task import Task

from .harness import Stat, interleaved

GOAL_NS = 5000


class _Drop(SpanExporter):
    def export(self, spans: object) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@contextlib.contextmanager
def _tracing(on: bool):
    """An SDK TracerProvider (spans built, then dropped) for the block, or none."""
    if not on:
        yield
        return
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_Drop()))
    original = otel.trace.get_tracer_provider
    otel.trace.get_tracer_provider = lambda: provider
    try:
        yield
    finally:
        otel.trace.get_tracer_provider = original


def _blocks(task: Task | None) -> Callable[[int], None]:
    """n tool blocks, inside `task` (entered once, outside the timing: its end is a task's
    cost, measured apart) or outside any task."""
    def run(n: int) -> None:
        if task is not None:
            task.works.clear()
        tool = exporter.tool
        for _ in range(n):
            with tool("search"):
                pass
    return run


def _outside(fn: Callable[[int], None], traced: bool) -> Callable[[int], None]:
    """`fn` run with no task current (in a fresh context); traced, inside a recording span
    (a request the app traces: where a block outside any task is a span)."""
    def in_span(n: int) -> None:
        tracer = otel.trace.get_tracer_provider().get_tracer("bench")
        with tracer.start_as_current_span("request"):
            fn(n)

    def run(n: int) -> None:
        contextvars.Context().run(in_span if traced else fn, n)
    return run


def _spans(n: int) -> None:
    """The app's own span per block: what OpenTelemetry costs without this library."""
    tracer = otel.trace.get_tracer_provider().get_tracer("bench")
    for _ in range(n):
        with tracer.start_as_current_span("search"):
            pass


def _bare(n: int) -> None:
    null = contextlib.nullcontext
    for _ in range(n):
        with null():
            pass


def _calls(steps: int, in_task: bool) -> Callable[[int], None]:
    def one_task() -> None:
        for _ in range(steps):
            with exporter.track(model="m", provider="p") as call:
                call.sent()
                call.headers()
                call.token()
                call.usage(output=1)

    def run(n: int) -> None:
        for _ in range(n):
            if in_task:
                with exporter.task("bench"):
                    one_task()
            else:
                one_task()
    return run


def _empty_task(n: int) -> None:
    for _ in range(n):
        with exporter.task("bench"):
            pass


def _empty_block(n: int) -> None:
    for _ in range(n):
        with contextlib.nullcontext():
            pass


def block_cost(runs: int, ops: int) -> tuple[list[str], Stat]:
    lines = []
    in_task = None
    for traced in (False, True):
        with _tracing(traced):
            contenders = {"bare": _bare}
            with exporter.task("bench") as task:
                contenders.update({"in task": _blocks(task),
                                   "no task": _outside(_blocks(None), traced)})
                if traced:
                    contenders["span"] = _spans
                res = interleaved(contenders, ops, runs)
        label = "with an SDK TracerProvider" if traced else "without tracing"
        for name in ("in task", "no task"):
            added = Stat.of([t - b for t, b in zip(res[name], res["bare"])])
            if name == "in task" and not traced:
                in_task = added
            goal = f"≤ {GOAL_NS // 1000} µs" if not traced else ""
            verdict = ("met" if added.median <= GOAL_NS else "missed") if not traced else ""
            where = "inside a task" if name == "in task" else (
                "outside any task, in a request span" if traced else "outside any task")
            lines.append(f"| tool block {where}, {label} | {added.fmt('ns')} | {goal} | "
                         f"{verdict} |")
        if traced:  # the block's span against the app's own span, run by run
            ratio = Stat.of([(t - b) / (p - b) for t, p, b in
                             zip(res["in task"], res["span"], res["bare"])])
            lines.append(f"| traced tool block inside a task / a plain "
                         f"`start_as_current_span` block | {ratio.fmt('×', 2)} | | |")
    assert in_task is not None
    return lines, in_task


def task_cost(runs: int, ops: int, steps: int = 12) -> list[str]:
    res = interleaved({"empty block": _empty_block, "empty task": _empty_task}, ops, runs)
    empty = Stat.of([(t - b) / 1000 for t, b in zip(res["empty task"], res["empty block"])])
    res = interleaved({"calls": _calls(steps, False), "task": _calls(steps, True)},
                      max(ops // 20, 5), runs)
    added = Stat.of([(t - c) / 1000 for t, c in zip(res["task"], res["calls"])])
    calls = Stat.of([c / 1000 for c in res["calls"]])
    return [f"| a task with no step (enter, summary, record, exit) | {empty.fmt('µs', 1)} | | |",
            f"| a {steps}-step task over its {steps} `track()` calls | {added.fmt('µs', 1)} | | |",
            f"| (the {steps} calls themselves) | {calls.fmt('µs', 1)} | | |"]


def run(quick: bool) -> list[str]:
    runs, ops = (3, 200) if quick else (15, 20000)
    runtime.configure(None)
    lines = ["| figure | median (min, max) | goal | |", "| --- | --- | --- | --- |"]
    blocks, _ = block_cost(runs, ops)
    lines += blocks
    lines += task_cost(runs, ops // 10)
    runtime.configure(None)
    return lines


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv)))
