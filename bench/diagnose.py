"""`ttft-exporter diagnose` on the demo's incident day: how long a run takes against a real
Prometheus, and which cause it names for each incident's target (a confusion table).

The day is the one tests/test_incident_day.py plays (tests/support/incident_day.py: 40 s calm,
20 s per incident, the generated rules loaded); each incident is diagnosed over its phase from
4 s in against the calm (`--at`, `--baseline-at`, `--min-calls 5`), in-process (the command's
own code, without the interpreter's start-up), and the calm's second half against its first.

    python -m bench.diagnose        # prints the markdown lines
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path
from statistics import median

from exporter._internal import runtime
from exporter._internal.config import loader as config_loader
from exporter._internal.diagnose.causes import Finding
from exporter._internal.evidence.thresholds import CAUSES, DEFAULT
from exporter._internal.evidence.signals import SIGNALS
from exporter._internal.diagnose.run import Prometheus, Request, diagnose
from exporter._internal.generate.files import RULE_FILES, generate

SKIP, RUNS, MIN_CALLS = 4.0, 5, 5


def on_target(incident: str, f: Finding) -> bool:
    """The (model, route) findings an incident's cause belongs to."""
    return {"prefill_surge": f.route == "search", "cold_cache": "tenant-01" in f.tenants,
            "noisy_neighbour": f.model == "llama-3-8b",
            "route_change": f.model == "deepseek-r1"}[incident]


def run(quick: bool = False) -> list[str]:
    """The markdown lines; `quick` (the suite's smoke run) skips it: the day takes 155 s."""
    if quick:
        return ["(not run with --quick: it plays the 155 s incident day)"]
    from tests.support.incident_day import CALM, CONFIG, PHASE, played_day

    cfg = config_loader.load(CONFIG)
    runtime.configure(cfg)
    thresholds = replace(DEFAULT, min_calls=MIN_CALLS)
    with tempfile.TemporaryDirectory() as out:
        generate(cfg, Path(out))
        with played_day(cfg, [Path(out) / "alerts" / name for name in RULE_FILES]) as day:
            client = Prometheus(day.prom.url)
            seconds: list[float] = []
            rows = []
            half = (CALM - SKIP) / 2
            calm = diagnose(client, Request(at=day.start + CALM, since=half, baseline=half,
                                            baseline_at=day.start + CALM - half), thresholds)
            for phase in day.schedule.phases:
                if phase.incident is None:
                    continue
                req = Request(at=day.start + phase.start + phase.seconds, since=PHASE - SKIP,
                              baseline=CALM - SKIP, baseline_at=day.start + CALM)
                for _ in range(RUNS):
                    began = time.perf_counter()
                    findings = diagnose(client, req, thresholds)
                    seconds.append(time.perf_counter() - began)
                target = [f for f in findings if on_target(phase.incident, f)]
                other = [f for f in findings if not on_target(phase.incident, f)]
                rows.append((phase.incident, target, other))
    runtime.configure(None)
    lines = [f"A diagnose run ({2 * len(SIGNALS) + 2} instant queries, most in 8 threads, then "
             f"the decision): median {median(seconds) * 1000:.0f} ms, max "
             f"{max(seconds) * 1000:.0f} ms over {len(seconds)} runs against the incident "
             f"day's Prometheus.", "",
             f"The calm's second half against its first: {len(calm)} findings"
             + (": " + ", ".join(f"{f.model}/{f.route}: {f.cause}" for f in calm) if calm
                else "."), "",
             "Findings per incident: on its target (the cause named for each target (model, "
             "route)), and elsewhere.", "",
             "| incident | " + " | ".join(CAUSES) + " | elsewhere |",
             "| --- |" + " --- |" * (len(CAUSES) + 1)]
    for incident, target, other in rows:
        counts = [sum(f.cause == cause for f in target) for cause in CAUSES]
        elsewhere = ", ".join(f"{f.model}/{f.route}: {f.cause}" for f in other) or "-"
        lines.append(f"| {incident} | " + " | ".join(map(str, counts)) + f" | {elsewhere} |")
    return lines + ["", "Off target, `unknown` is a rise of no known cause on a shared machine "
                    "(one process runs the load, the provider and the exporter; a cold tenant's "
                    "caches rewarm after its phase); a named cause off target would be a wrong "
                    "diagnosis (tests/test_incident_day.py fails on it)."]


if __name__ == "__main__":
    print("\n".join(run()))
