"""One pod of a fleet for the native-histogram end-to-end test, as its own process.

    python -m tests.support.fleet_pod POD [PUSH_URL]

Records the first tenth of pod POD's calls (so its series exist), then prints the URL it serves
(`exporter.start_http_server`) or, with PUSH_URL, `pushing` (a push worker of that aggregator).
Each line `record` on stdin records the rest and answers `recorded`; end of stdin stops it.
The test computes the exact quantiles and SLO counts from `calls(POD)`, the same values.
"""

from __future__ import annotations

import random
import sys

import exporter
from exporter._internal import runtime
from exporter._internal.record.timeline import CallTimeline

CALLS = 3000
MODEL, ROUTE, PROVIDER = "fleet-model", "chat", "p"
#: Per pod: TTFT median (seconds); the pods differ, one is slow.
TTFT_MEDIANS = (0.4, 0.8, 1.6)


def calls(pod: int) -> list[tuple[int, int]]:
    """(TTFT µs, largest inter-token gap µs) of each call of one pod: lognormal, seeded."""
    rng = random.Random(1000 + pod)
    return [(int(rng.lognormvariate(0, 0.7) * TTFT_MEDIANS[pod] * 1e6),
             int(rng.lognormvariate(0, 1.0) * 1e6)) for _ in range(CALLS)]


def record(values: list[tuple[int, int]]) -> None:
    rec = runtime.state().recorder
    for i, (ttft, gap) in enumerate(values):  # timeline stamps are nanoseconds
        t = CallTimeline(start=0, model=MODEL, route=ROUTE, tenant=f"t{i % 4}",
                         provider=PROVIDER)
        t.token(ttft * 1000)
        t.token((ttft + gap) * 1000)
        t.end = (ttft + gap + 1) * 1000
        t.outcome = "ok"
        rec.record_call(t)


def main() -> None:
    pod = int(sys.argv[1])
    values = calls(pod)
    first = CALLS // 10
    if len(sys.argv) > 2:
        runtime.configure({"push_url": sys.argv[2], "push": {"interval_seconds": 0.2}})
        record(values[:first])
        print("pushing", flush=True)
    else:
        record(values[:first])
        print(exporter.start_http_server(port=0).url, flush=True)
    for line in sys.stdin:
        if line.strip() == "record":
            record(values[first:])
            print("recorded", flush=True)


if __name__ == "__main__":
    main()
