"""What each way of instrumenting adds to one real openai call, warm and cold (issue #23's table).

`python -m bench.call_table [--quick]` prints a markdown section; `run(quick)` returns it for
`python -m bench`. The contenders: the unpatched SDK, `exporter.instrument()`, the same with an
OpenTelemetry SDK TracerProvider set (a span per call), and OpenLLMetry
(`opentelemetry-instrumentation-openai`, traces and metrics; a bench-only dependency, the row
says so when it is missing). The calls: a non-stream `chat.completions.create`, and a stream of
one chunk with a usage chunk, of a real `openai.OpenAI` client on its own httpx2 client whose
transport answers from memory (no network) and calls the httpx `trace` extension as httpcore
does on a reused connection.

Every measurement runs in a fresh interpreter, so no contender inherits another's patches,
providers or heap. A round runs every contender once per call kind, in a shuffled order; the
added cost is taken within the round (contender minus unpatched) and the table gives its
median over the rounds with the min and max. Two figures per measurement, both labelled:
*cold*, the mean of the first calls after the contender was set up (first use of its code
paths, CPython's specialisations not yet adapted), and *warm*, the mean of the calls that
follow a warm-up. Times are the calling thread's CPU time (what the caller pays; steadier than
wall time on a busy machine).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

from bench.shim_overhead import _openai_calls, _stat

#: The contenders, in the table's order.
CONTENDERS = ("unpatched", "exporter", "exporter_traced", "openllmetry")
LABELS = {"unpatched": "unpatched SDK (µs per call, not added)",
          "exporter": "`exporter.instrument()`",
          "exporter_traced": "the same with an OpenTelemetry TracerProvider set",
          "openllmetry": "OpenLLMetry `opentelemetry-instrumentation-openai` (traces + metrics)"}
CALLS = ("non_stream", "stream")
#: The goals of issue #23 for the warm added cost per call.
GOAL_US = {"exporter": 20.0, "exporter_traced": 60.0}


def _setup(contender: str) -> None:
    """Install one contender in this (fresh) interpreter."""
    if contender in ("exporter_traced", "openllmetry"):
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (BatchSpanProcessor, SpanExporter,
                                                    SpanExportResult)

        class Discard(SpanExporter):  # exporting is off the request path: nothing is sent
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Discard()))
        trace.set_tracer_provider(provider)
    if contender in ("exporter", "exporter_traced"):
        import exporter

        exporter.instrument()
    elif contender == "openllmetry":
        from opentelemetry import metrics
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor
        from opentelemetry.sdk.metrics import MeterProvider

        metrics.set_meter_provider(MeterProvider())
        OpenAIInstrumentor().instrument()


def child(contender: str, call: str, cold: int, warm_up: int, warm: int) -> dict[str, float]:
    """One measurement, in this fresh interpreter: µs per call of the CPU time, cold and warm."""
    non_stream, stream = _openai_calls()
    fn: Callable[[], None] = non_stream if call == "non_stream" else stream
    fn()  # the client's own first use (imports, connection pool), before any contender
    _setup(contender)
    cpu = time.thread_time_ns
    c0 = cpu()
    for _ in range(cold):
        fn()
    c1 = cpu()
    for _ in range(warm_up):
        fn()
    c2 = cpu()
    for _ in range(warm):
        fn()
    c3 = cpu()
    return {"cold": (c1 - c0) / cold / 1000, "warm": (c3 - c2) / warm / 1000}


def _available(contender: str) -> bool:
    if contender != "openllmetry":
        return True
    try:
        import opentelemetry.instrumentation.openai  # noqa: F401
    except ImportError:
        return False
    return True


def _measure(contender: str, call: str, sizes: tuple[int, int, int]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.call_table", "--child", contender, call,
         *map(str, sizes)], capture_output=True, text=True, check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout)


def _smoke_measures(contenders: list[str], sizes: tuple[int, int, int]
                    ) -> Callable[[str, str, tuple[int, int, int]], dict[str, float]]:
    """The quick run's one round, every contender × call forked from one interpreter
    (bench/forked.py), looked up as `_measure` would run it."""
    from bench.call_table import child as child_in_this_module  # not __main__'s
    from bench.forked import each_in_a_fork

    pairs = [(contender, call) for call in CALLS for contender in contenders]
    results = dict(zip(pairs, each_in_a_fork(child_in_this_module,
                                             [(*pair, *sizes) for pair in pairs])))
    return lambda contender, call, _: results[(contender, call)]


def run(quick: bool) -> list[str]:
    rounds = 1 if quick else 9
    sizes = (10, 50, 40) if quick else (20, 400, 800)  # cold calls, warm-up calls, warm calls
    contenders = [c for c in CONTENDERS if _available(c)]
    shuffle = random.Random(23)
    # samples[call][contender][figure] -> one value per round
    samples: dict[str, dict[str, dict[str, list[float]]]] = {
        call: {c: {"cold": [], "warm": []} for c in contenders} for call in CALLS}
    measure = _smoke_measures(contenders, sizes) if quick else _measure
    for _ in range(rounds):
        for call in CALLS:
            order = list(contenders)
            shuffle.shuffle(order)
            for contender in order:
                result = measure(contender, call, sizes)
                for figure in ("cold", "warm"):
                    samples[call][contender][figure].append(result[figure])
    try:
        load = f" Load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."
    except OSError:
        load = ""
    lines = [f"{rounds} rounds; in each, every contender × call in a fresh interpreter, in a "
             f"shuffled order: {sizes[0]} *cold* calls right after the contender was set up, "
             f"{sizes[1]} warm-up calls, then {sizes[2]} *warm* calls. Added = contender minus "
             f"unpatched of the same round; median (min–max) over the rounds, µs of the calling "
             f"thread's CPU per call.{load}", "",
             "| contender | non-stream, warm | non-stream, cold | one-chunk stream with usage, "
             "warm | one-chunk stream with usage, cold | goal (warm) |",
             "| --- | --- | --- | --- | --- | --- |"]
    figures: dict[str, float] = {}
    for contender in CONTENDERS:
        if contender not in contenders:
            lines.append(f"| {LABELS[contender]} | not installed: `pip install "
                         f"opentelemetry-instrumentation-openai` | | | | |")
            continue
        cells = []
        worst = 0.0
        for call in CALLS:
            for figure in ("warm", "cold"):
                mine = samples[call][contender][figure]
                base = samples[call]["unpatched"][figure]
                values = mine if contender == "unpatched" else [m - b for m, b in zip(mine, base)]
                sign = "" if contender == "unpatched" else "+"
                cells.append(sign + _stat(values, 1))
                if figure == "warm" and contender != "unpatched":
                    worst = max(worst, statistics.median(values))
        goal = GOAL_US.get(contender)
        verdict = "" if goal is None else \
            f"≤ {goal:.0f} µs: {'met' if worst <= goal else f'missed ({worst:.0f} µs)'}"
        figures[contender] = worst
        lines.append(f"| {LABELS[contender]} | " + " | ".join(cells) + f" | {verdict} |")
    if "openllmetry" in figures and figures.get("exporter"):
        lines += ["", f"OpenLLMetry adds {figures['openllmetry'] / figures['exporter']:.1f}× what "
                      f"`exporter.instrument()` adds per warm call (the worse of the two calls)."]
    return lines


if __name__ == "__main__":
    if "--child" in sys.argv:
        args = sys.argv[sys.argv.index("--child") + 1:]
        print(json.dumps(child(args[0], args[1], *map(int, args[2:5]))))
    else:
        print("\n".join(run("--quick" in sys.argv)))
