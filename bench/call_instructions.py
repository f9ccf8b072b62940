"""Where the instructions a patched call adds go (callgrind): the `make bench` section that
explains the per-call goals' gap by measurement, part by part.

`python -m bench.call_instructions` counts every case of CASES under valgrind's callgrind (a
fixed hash seed), each in a process of its own: the case is set up, makes 50 calls of warm-up,
then 200 calls between two `os.getppid()` calls, where callgrind dumps its counts, so the
second dump holds those calls alone. The calls are the bench's real openai client on a
`MockTransport` (bench/shim_overhead.py): a non-stream `create` and a one-token stream.
A part's share is the patched call minus the same call with that part taken out:
- the httpx trace extension: the hook's `attach_build` wrapped, the wrapper detaching the
  extension from each request, against the same wrapper leaving it;
- recording: `derive` and `Recorder.record_call` replaced by C builtins that do nothing (`id`,
  `slice`), which is what an untraced call does with their results;
- the C parts (setup.py): the same call with the Python fallback a build without a compiler runs.
The traced call sets an OpenTelemetry SDK TracerProvider (BatchSpanProcessor, spans
discarded); the OpenTelemetry SDK's own share is a bare span with what the call's span holds
(5 attributes at the start, `propagate.inject`, 16 at the end, 5 events), in a loop.
Instruction counts do not depend on the machine's load, unlike the times of the other sections.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: The cases, each counted in a process of its own (what one case leaves behind, a heap the
#: garbage collector walks or a tracer provider, never reaches another).
CASES = ("unpatched", "unpatched_stream", "patched", "patched_stream", "wrapped",
         "no_trace_extension", "no_recording", "python", "python_stream", "traced", "span")


def run_case(case: str, n: int, warm: int = 50) -> None:
    """The measured process: one case set up, `warm` calls, then `n` calls between two
    `os.getppid()` calls (where callgrind dumps: the second dump holds the n calls alone)."""
    import exporter
    from bench.shim_overhead import _openai_calls
    from bench.traced_instructions import _traced_provider, span_loop
    from exporter._internal import runtime
    from exporter._internal.record import histogram, recorder, timeline
    from exporter._internal.shim import manual, sdk_call, tokens

    non_stream, stream = _openai_calls()
    non_stream(), stream()  # the client's own first use, before any patch
    fn = stream if case.endswith("stream") else non_stream
    if case == "span":
        _traced_provider()
        fn = span_loop()
    elif not case.startswith("unpatched"):
        if case == "traced":
            _traced_provider()
        exporter.instrument()
    if case in ("wrapped", "no_trace_extension"):  # the same wrapper, attaching or not
        attach_build = sdk_call.SdkCall.attach_build
        detach = case == "no_trace_extension"

        def wrapper(call: Any, request: Any) -> None:
            attach_build(call, request)
            if detach:
                del request.extensions["trace"]

        sdk_call.SdkCall.attach_build = wrapper  # type: ignore[method-assign]
    elif case == "no_recording":
        manual.derive = id  # type: ignore[assignment]
        runtime.state().recorder.record_call = slice  # type: ignore[method-assign]
    elif case.startswith("python"):
        tokens.Stamper = recorder.append_in_c = histogram.bucket_groups = None
        sdk_call._Tracer = None
        manual.derive = timeline.derive_in_python
    for _ in range(warm):
        fn()
    os.getppid()  # callgrind dumps here: the set-up and warm-up
    for _ in range(n):
        fn()
    os.getppid()  # ...and here: the case's calls


def _instructions(case: str, n: int, warm: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=os_getppid",
                        f"--callgrind-out-file={out}", sys.executable, "-c",
                        f"from bench.call_instructions import run_case; "
                        f"run_case({case!r}, {n}, {warm})"],
                       check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        with open(f"{out}.2") as f:
            total = re.search(r"^(?:totals|summary): (\d+)", f.read(), re.M)
        return int(total.group(1)) / n  # type: ignore[union-attr]


def instructions(n: int, warm: int = 50) -> dict[str, float]:
    """Instructions per call of each case (the processes run side by side: counts do not
    depend on the load)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counts = pool.map(lambda case: _instructions(case, n, warm), CASES)
        return dict(zip(CASES, counts))


def _ns_per_instruction(unpatched: float) -> float:
    """This machine's CPU time per instruction of the unpatched SDK call (warm, in this
    process): what turns the goal's µs into instructions."""
    from bench.shim_overhead import _openai_calls

    non_stream, _ = _openai_calls()
    for _ in range(300):
        non_stream()
    best = float("inf")
    for _ in range(5):
        started = time.thread_time_ns()
        for _ in range(300):
            non_stream()
        best = min(best, (time.thread_time_ns() - started) / 300)
    return best / unpatched


def run(quick: bool) -> list[str]:
    if quick:  # (the smoke test: every case set up and called, without valgrind's minutes)
        from bench.call_instructions import run_case as case_in_this_module  # not __main__'s
        from bench.forked import each_in_a_fork

        each_in_a_fork(case_in_this_module, [(case, 2, 1) for case in CASES])
        return ["--quick: every case ran, natively; the counts need the full run under "
                "valgrind."]
    if shutil.which("valgrind") is None:
        return ["valgrind is not installed here (`make bench` installs it with apt-get): no "
                "instruction counts."]
    n, warm = 200, 50
    c = instructions(n, warm)
    ns = _ns_per_instruction(c["unpatched"])
    added = c["patched"] - c["unpatched"]
    added_stream = c["patched_stream"] - c["unpatched_stream"]
    trace = c["wrapped"] - c["no_trace_extension"]
    recording = c["patched"] - c["no_recording"]
    rest = added - trace - recording
    goal = 20_000 / ns

    def row(what: str, count: float, note: str = "") -> str:
        return f"| {what} | {count:+,.0f} | {count * ns / 1000:.0f} µs | {note} |"

    return [
        f"Instructions per call (callgrind, {n} calls after {warm} of warm-up, a process per "
        "case; "
        "`python -m bench.call_instructions`): how far the per-call goals are, part by part. "
        f"At this machine's {ns:.2f} ns per instruction of the unpatched call "
        f"({c['unpatched']:,.0f} instructions, its CPU time measured warm here), 20 µs is "
        f"{goal:,.0f} instructions. The µs column is the count at that rate: the end-to-end "
        "times are the section above.", "",
        "| part of the call | instructions added | ≈ at that rate | next step |",
        "| --- | ---: | ---: | --- |",
        row("**non-stream call, `exporter.instrument()`**", added,
            f"goal ≤ 20 µs: {'met' if added <= goal else 'missed'}"),
        row("... the httpx trace extension (9 events, 5 stamped)", trace,
            "C already (`_hottrace.c`); what is left is httpcore calling it"),
        row("... recording: `derive` and `record_call` (lock, labels, rows, appends, the "
            "folds of full batches)", recording,
            "the rows and labels of the common case in C beside the appends"),
        row("... the rest: the SDK wrappers, the call and its timeline, labels, usage, the "
            "in-flight count", rest,
            "wrappers with each SDK method's own signature; the call's start in C"),
        row("**one-token stream, `exporter.instrument()`**", added_stream,
            f"goal ≤ 20 µs: {'met' if added_stream <= goal else 'missed'}"),
        row("non-stream, without the C parts (a build without a compiler)",
            c["python"] - c["unpatched"], ""),
        row("one-token stream, without the C parts", c["python_stream"] - c["unpatched_stream"],
            ""),
        row("**non-stream, a TracerProvider set**", c["traced"] - c["unpatched"],
            f"goal ≤ 60 µs: {'met' if c['traced'] - c['unpatched'] <= 3 * goal else 'missed'}"),
        row("... the OpenTelemetry SDK alone: the call's span (start, inject, 21 attributes, "
            "5 events, end)", c["span"],
            "the SDK's own cost: below the goal only without the SDK's span"),
    ]


def main(argv: list[str]) -> int:
    print("\n".join(run(quick=bool(argv and argv[0] == "--quick"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
