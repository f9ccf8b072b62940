"""Instructions per `Recorder.record_call` and per `derive` (callgrind), as
docs/performance.md quotes them, each with the optional C part (_hotrecord.c) and in Python.

`python -m bench.record_instructions [CALLS]` runs this module's `calls` under valgrind's
callgrind (a fixed hash seed): CALLS non-stream calls counted in flight and recorded, and the
same without recording; the difference over CALLS is what one `record_call` costs. The call
has usage, a finish reason and four phases (9 values); its `derive` is done before, and no
reader takes the series, so every 64th call folds each series' batch on the caller's thread.
`derive` is counted the same way: CALLS derives of that call against none.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from typing import Any


def the_call() -> Any:
    """The call both loops take: usage, a finish reason, four phases (9 values)."""
    from exporter._internal.record.timeline import CallTimeline

    s = 10**12
    return CallTimeline(start=s, model="gpt-4o-mini", provider="openai", route="/chat",
                        tenant="acme", dispatched=s + 20_000, connected=s + 900_000,
                        sent=s + 1_000_000, headers=s + 300_000_000, end=s + 310_000_000,
                        input_tokens=120, output_tokens=40, outcome="ok", max_tokens=256,
                        finish_reason="stop")


def calls(n: int, record: bool, in_c: bool = True) -> None:
    from exporter._internal.record import histogram, recorder
    from exporter._internal.record.recorder import Recorder
    from exporter._internal.record.timeline import derive

    if not in_c:  # the per-value loop and the folds' bucket grouping in Python
        recorder.append_in_c = histogram.bucket_groups = None

    rec = Recorder()
    t = the_call()
    d = derive(t)
    started, record_call = rec.started, rec.record_call
    for _ in range(200):  # the series and rows exist, as in a process that served calls
        record_call(t, started("gpt-4o-mini", "openai", "/chat"), d)
    for _ in range(n):
        key = started("gpt-4o-mini", "openai", "/chat")
        if record:
            record_call(t, key, d)


def derives(n: int, in_c: bool) -> None:
    """n derives of the same call as `calls` records (none: n=0), in C or in Python."""
    from exporter._internal.record.timeline import derive, derive_in_python

    function = derive if in_c else derive_in_python
    t = the_call()
    for _ in range(200 + n):
        function(t)


def _instructions(code: str) -> int:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        sys.executable, "-c", f"import bench.record_instructions as b; {code}"],
                       check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        with open(out) as f:
            return int(re.search(r"^totals: (\d+)", f.read(), re.M).group(1))  # type: ignore


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 2000
    for in_c, where in ((True, "the C part"), (False, "Python")):
        per_call = (_instructions(f"b.calls({n}, True, {in_c})")
                    - _instructions(f"b.calls({n}, False, {in_c})")) / n
        print(f"record_call ({where}): {per_call:,.0f} instructions per call ({n:,} calls)")
        per_call = (_instructions(f"b.derives({n}, {in_c})")
                    - _instructions(f"b.derives(0, {in_c})")) / n
        print(f"derive ({where}): {per_call:,.0f} instructions per call ({n:,} calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
