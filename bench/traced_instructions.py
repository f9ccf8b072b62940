"""Instructions a traced call adds, and the OpenTelemetry SDK's share (callgrind), as
docs/performance.md ("The traced call") quotes them.

`python -m bench.traced_instructions [CALLS]` runs each case under valgrind's callgrind (a fixed
hash seed) and counts only CALLS calls after 50 of warm-up: callgrind dumps its counts when the
process enters `os.getppid`, called just before and just after them, and the second dump holds
the calls alone. The cases: the bench's real openai non-stream call (bench/shim_overhead.py)
unpatched, patched, patched with an SDK TracerProvider (BatchSpanProcessor, spans discarded),
and the same without the phase-boundary events; the bench's one-token stream unpatched and
patched (`unpatched_stream`, `patched_stream`); and the OpenTelemetry SDK alone in a loop: a
span started with 5 attributes and ended, then with `propagate.inject` and 16 attributes set,
then with 5 events too (what one call's span holds).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from typing import Callable

CALL_CASES = ("unpatched", "patched", "traced", "traced_without_events")
STREAM_CASES = ("unpatched_stream", "patched_stream")
SPAN_CASES = ("span", "span_inject_attributes", "span_inject_attributes_events")


def _traced_provider() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (BatchSpanProcessor, SpanExporter,
                                                SpanExportResult)

    class Discard(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    trace.set_tracer_provider(provider)


def span_loop(inject_and_attributes: bool = True, events: bool = True) -> Callable[[], None]:
    """One span of the current provider's SDK with what a call's span holds: 5 attributes at
    its start, then `propagate.inject` and 16 more, then 5 events, then its end."""
    import time

    from opentelemetry import trace
    from opentelemetry.propagate import inject

    tracer = trace.get_tracer_provider().get_tracer("bench")
    start = {f"gen_ai.start{i}": "value" for i in range(5)}
    end = {f"gen_ai.end{i}": float(i) for i in range(16)}

    def call() -> None:
        span = tracer.start_span("chat model", kind=trace.SpanKind.CLIENT, attributes=start)
        if inject_and_attributes:
            inject({}, context=trace.set_span_in_context(span))
            span.set_attributes(end)
            if events:
                for _ in range(5):
                    span.add_event("phase", timestamp=time.time_ns())
        span.end()

    return call


def run_case(case: str, n: int) -> None:
    """The measured process: set the case up, warm it, then `n` calls between the markers."""
    if case in CALL_CASES or case in STREAM_CASES:
        from bench.shim_overhead import _openai_calls

        call, stream = _openai_calls()
        if case in STREAM_CASES:
            call = stream
        call()  # the client's own first use, before any patch
        if case.startswith("traced"):
            _traced_provider()
        if not case.startswith("unpatched"):
            import exporter

            exporter.instrument()
        if case == "traced_without_events":
            from exporter._internal import names

            names.SPAN_EVENTS = ()  # type: ignore[misc]
    else:
        _traced_provider()
        call = span_loop(inject_and_attributes=case != "span",
                         events=case == "span_inject_attributes_events")
    for _ in range(50):
        call()
    os.getppid()  # callgrind dumps here: the setup
    for _ in range(n):
        call()
    os.getppid()  # ...and here: the n calls


def _instructions(case: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=os_getppid",
                        f"--callgrind-out-file={out}", sys.executable, "-c",
                        f"from bench.traced_instructions import run_case; "
                        f"run_case({case!r}, {n})"], check=True, capture_output=True,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
        with open(f"{out}.2") as f:
            return int(re.search(r"^(?:totals|summary): (\d+)", f.read(), re.M).group(1))  # type: ignore


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 200
    per_call = {case: _instructions(case, n) / n
                for case in (*CALL_CASES, *STREAM_CASES, *SPAN_CASES)}
    base = per_call["unpatched"]
    print(f"instructions per call ({n:,} calls after 50 of warm-up, callgrind):")
    print(f"- openai non-stream create, unpatched: {base:,.0f}")
    for case in CALL_CASES[1:]:
        print(f"- {case.replace('_', ' ')}: +{per_call[case] - base:,.0f}")
    print(f"- openai one-token stream, unpatched: {per_call['unpatched_stream']:,.0f}; "
          f"patched: +{per_call['patched_stream'] - per_call['unpatched_stream']:,.0f}")
    print(f"- the phase-boundary events: "
          f"{per_call['traced'] - per_call['traced_without_events']:,.0f}")
    for case in SPAN_CASES:
        print(f"- OpenTelemetry SDK alone, {case.replace('_', ' + ')}: {per_call[case]:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
