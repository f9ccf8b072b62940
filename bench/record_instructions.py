"""Instructions per `Recorder.record_call` (callgrind), as docs/performance.md quotes them.

`python -m bench.record_instructions [CALLS]` runs this module's `calls` twice under valgrind's
callgrind (a fixed hash seed): CALLS non-stream calls counted in flight and recorded, and the
same without recording; the difference over CALLS is what one `record_call` costs. The call
has usage, a finish reason and four phases (9 values); its `derive` is done before, and no
reader takes the series, so every 64th call folds each series' batch on the caller's thread.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile


def calls(n: int, record: bool) -> None:
    from exporter._internal.record.recorder import Recorder
    from exporter._internal.record.timeline import CallTimeline, derive

    rec = Recorder()
    s = 10**12
    t = CallTimeline(start=s, model="gpt-4o-mini", provider="openai", route="/chat",
                     tenant="acme", dispatched=s + 20_000, connected=s + 900_000,
                     sent=s + 1_000_000, headers=s + 300_000_000, end=s + 310_000_000,
                     input_tokens=120, output_tokens=40, outcome="ok", max_tokens=256,
                     finish_reason="stop")
    d = derive(t)
    started, record_call = rec.started, rec.record_call
    for _ in range(200):  # the series and rows exist, as in a process that served calls
        record_call(t, started("gpt-4o-mini", "openai", "/chat"), d)
    for _ in range(n):
        key = started("gpt-4o-mini", "openai", "/chat")
        if record:
            record_call(t, key, d)


def _instructions(n: int, record: bool) -> int:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        sys.executable, "-c", f"from bench.record_instructions import calls; "
                        f"calls({n}, {record})"], check=True, capture_output=True,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
        with open(out) as f:
            return int(re.search(r"^totals: (\d+)", f.read(), re.M).group(1))  # type: ignore


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 2000
    per_call = (_instructions(n, True) - _instructions(n, False)) / n
    print(f"record_call: {per_call:,.0f} instructions per call ({n:,} calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
