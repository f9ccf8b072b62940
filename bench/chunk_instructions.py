"""Instructions per streamed event (callgrind), as docs/performance.md quotes them.

`python -m bench.chunk_instructions [EVENTS]` runs, per wire format, EVENTS text deltas the SDK
already parsed through each loop under valgrind's callgrind: the SDK's own iteration alone
(`Stream.__iter__` around a generator), the C loop (`_hotloop.Stamper`, what the hook installs
where the extension is built), the Python loop (`sync_tokens`, a build without a compiler),
and the floor of any Python loop (a generator that only stamps and appends). Callgrind dumps
when the process enters `os.getppid`, called just before and just after the events, so the
second dump holds them alone; each figure is its loop minus the SDK's iteration, per event.
Instruction counts do not depend on the machine's load, unlike the times of docs/benchmarks.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from typing import Any

LOOPS = ("bare", "c", "python", "floor")
FORMATS = ("chat", "responses", "anthropic")
CASES = [(fmt, loop) for fmt in FORMATS for loop in LOOPS]


def run_cases(n: int) -> None:
    """Every (format, loop) of CASES in turn, each between two `os.getppid()` calls."""
    from bench.shim_overhead import _WIRE_FORMATS, _parsed_events, no_record_call, sdk_iter
    from exporter._internal.shim import anthropic as shim_anthropic, openai as shim_openai
    from exporter._internal.shim import tokens

    NoRecord = no_record_call()

    def floor(it: Any, times: list[int]) -> Any:
        append, perf = times.append, tokens.perf_counter_ns
        for item in it:
            append(perf())
            yield item

    parsed = _parsed_events(n)
    endpoints = {"openai": shim_openai.ENDPOINTS, "anthropic": shim_anthropic.ENDPOINTS}
    for fmt, loop in CASES:
        sdk, path = next(where for key, where, _ in _WIRE_FORMATS if key == fmt)
        endpoint = endpoints[sdk][path]

        def wrap(it: Any) -> Any:
            if loop == "bare":
                return it
            if loop == "floor":
                return floor(it, [])
            call = NoRecord("m", "bench", endpoint, None)
            if loop == "c":
                if tokens.Stamper is None:
                    raise SystemExit("the C loop is not built here (pip install -e .)")
                return tokens.stamped(it, call)
            return tokens.sync_tokens(it, call)

        for _ in sdk_iter(wrap(iter(parsed[fmt]))):  # warm-up: caches, the classes learnt
            pass
        stream = sdk_iter(wrap(iter(parsed[fmt])))
        next(stream)  # the first answer token: the loop is hot from here on
        os.getppid()  # callgrind dumps here: the setup
        for _ in stream:
            pass
        os.getppid()  # ...and here: the events


def _instructions(n: int) -> dict[tuple[str, str], int]:
    """Instructions of each case's events: the even dumps (the odd ones hold the setups)."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=os_getppid",
                        f"--callgrind-out-file={out}", sys.executable, "-c",
                        f"from bench.chunk_instructions import run_cases; run_cases({n})"],
                       check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        counts = {}
        for i, case in enumerate(CASES):
            with open(f"{out}.{2 * i + 2}") as f:
                counts[case] = int(re.search(r"^(?:totals|summary): (\d+)", f.read(),
                                             re.M).group(1))  # type: ignore[union-attr]
        return counts


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 1000
    print(f"instructions per event, added to the SDK's own iteration ({n:,} events, callgrind):")
    print("| events | C loop | Python loop | floor of a Python loop |")
    print("| --- | ---: | ---: | ---: |")
    counts = _instructions(n)
    for fmt in FORMATS:
        added = {loop: (counts[fmt, loop] - counts[fmt, "bare"]) / (n - 1) for loop in LOOPS[1:]}
        print(f"| {fmt} | {added['c']:,.0f} | {added['python']:,.0f} | {added['floor']:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
