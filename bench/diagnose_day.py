"""The cause decision on the project's own incident day, scored as bench/diagnose_eval.py scores
the generator: precision per cause, recall on each incident's targets, false findings on calm
window pairs; for `ttft-exporter diagnose` (each incident against the calm) and for the
`LLMTTFTLikelyCause` alert (the watch's decision, every second, against the window one phase
earlier).

Each day is the compressed day of tests/test_incident_day.py (tests/support/incident_day.py:
the demo's provider, far region and load through the real SDKs, a real Prometheus scraping
every second with the generated rules, a `ttft-exporter watch` process), judged by the same
targets and the same rule of what is right (`acceptable`). The thresholds were not chosen on
it (docs/decisions.md: the generator's tuning seeds chose them); it is one more set of
scenarios nobody tuned against, small (9 (model, route)s, 4 incidents a day).

    python -m bench.diagnose_day [--days 3]      # prints the markdown docs/diagnose.md quotes
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from exporter._internal import runtime
from exporter._internal.config import loader as config_loader
from exporter._internal.demo.incidents import INCIDENTS
from exporter._internal.evidence.thresholds import DEFAULT, UNKNOWN
from exporter._internal.diagnose.run import Prometheus, Request, diagnose
from exporter._internal.generate.files import RULE_FILES, generate
from tests.support.incident_day import (CALM, CONFIG, MIN_CALLS, PHASE, SKIP, TARGETS, WINDOW,
                                        acceptable, alert_findings, live, played_day)

#: The (model, route)s each incident's target holds: the units recall is counted on (the
#: cold cache's one tenant counts once, on whichever of its routes it is named).
UNITS = {"prefill_surge": 3, "cold_cache": 1, "noisy_neighbour": 3, "route_change": 3}
#: The day's (model, route)s: 3 models × 3 routes.
PAIRS = 9


@dataclass
class Score:
    """What one decision (diagnose, or the alert) named over one or more days."""

    #: cause -> (right, named)
    named: Counter[str] = field(default_factory=Counter)
    right: Counter[str] = field(default_factory=Counter)
    #: incident -> on-target units named with its cause, and units
    found: Counter[str] = field(default_factory=Counter)
    units: Counter[str] = field(default_factory=Counter)
    #: calm (model, route) pairs judged, and those with a finding
    calm_pairs: int = 0
    calm_false: int = 0
    wrong: list[Any] = field(default_factory=list)

    def finding(self, f: dict[str, Any], incidents: list[str], where: Any) -> None:
        if f["cause"] == UNKNOWN:
            return
        self.named[f["cause"]] += 1
        if acceptable(f, incidents):
            self.right[f["cause"]] += 1
        else:
            self.wrong.append((where, f))


def _diagnose(prom: Prometheus, start: float, at: float, since: float, baseline_at: float,
              baseline: float) -> list[dict[str, Any]]:
    req = Request(at=start + at, since=since, baseline=baseline, baseline_at=start + baseline_at)
    return [f.as_json() for f in diagnose(prom, req, replace(DEFAULT, min_calls=MIN_CALLS))]


def score_diagnose(played: Any, score: Score) -> None:
    """Each incident (from SKIP in) against the calm, as tests/test_incident_day.py runs it;
    the calm's second half against its first for the false findings."""
    prom = Prometheus(played.prom.url)
    start = played.start
    for phase in played.schedule.phases:
        if not phase.incident:
            continue
        end = phase.start + phase.seconds
        findings = _diagnose(prom, start, end, phase.seconds - SKIP, CALM, CALM - SKIP)
        now = live(played.schedule, phase.start + SKIP, end)
        for f in findings:
            score.finding(f, now, phase.incident)
        on = {(f["model"], f["route"]) for f in findings
              if f["cause"] == phase.incident and TARGETS[phase.incident](f)}
        score.found[phase.incident] += min(len(on), UNITS[phase.incident])
        score.units[phase.incident] += UNITS[phase.incident]
    half = (CALM - SKIP) / 2
    calm = _diagnose(prom, start, CALM, half, CALM - half, half)
    score.calm_pairs += PAIRS
    score.calm_false += len(calm)
    for f in calm:
        score.finding(f, [], "calm")


def score_alert(played: Any, score: Score) -> None:
    """LLMTTFTLikelyCause every second from when the rules compare the calm with itself to a
    window after the day: each firing (second, finding) judged; an incident's target units
    count as found if the alert named them at any second of its phase or TAIL; each second
    with no live incident counts PAIRS calm pairs."""
    prom, start = played.prom, played.start
    until = played.end + WINDOW
    seen: dict[str, set[tuple[str, str]]] = {name: set() for name in INCIDENTS}
    for t, f in alert_findings(prom, start, played.end):
        now = live(played.schedule, t, t)
        score.finding(f, now, round(t))
        if not now:
            score.calm_false += 1
        if f["cause"] in seen and f["cause"] in now and TARGETS[f["cause"]](f):
            seen[f["cause"]].add((f["model"], f["route"]))
    for name, units in seen.items():
        score.found[name] += min(len(units), UNITS[name])
        score.units[name] += UNITS[name]
    first = WINDOW + PHASE  # the rules compare the calm with itself from here
    score.calm_pairs += PAIRS * sum(1 for t in range(int(first), int(until - start))
                                    if not live(played.schedule, t, t))


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f} % ({a} of {b})" if b else "—"


def report(scores: dict[str, Score], days: int) -> list[str]:
    lines = [f"The project's compressed incident day, played {days} time(s) "
             f"(tests/support/incident_day.py; thresholds not chosen on it):", "",
             "| decision | cause | precision | recall on its targets |",
             "| --- | --- | ---: | ---: |"]
    for who, s in scores.items():
        for cause in INCIDENTS:
            lines.append(f"| {who} | `{cause}` | {_pct(s.right[cause], s.named[cause])} | "
                         f"{_pct(s.found[cause], s.units[cause])} |")
    lines.append("")
    for who, s in scores.items():
        lines.append(f"- {who}: false findings on calm (model, route) pairs: "
                     f"{_pct(s.calm_false, s.calm_pairs)}; wrong findings: {len(s.wrong)}"
                     + (f" ({json.dumps(s.wrong[:3])})" if s.wrong else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=1)
    args = p.parse_args(argv)
    scores = {"diagnose": Score(), "alert (watch, every second)": Score()}
    cfg = config_loader.load(CONFIG)
    runtime.configure(cfg)
    try:
        with tempfile.TemporaryDirectory(prefix="ttft-day-") as directory:
            out = Path(directory)
            generate(cfg, out)
            rules = [out / "alerts" / name for name in RULE_FILES]
            for _ in range(args.days):
                with played_day(cfg, rules) as played:
                    score_diagnose(played, scores["diagnose"])
                    score_alert(played, scores["alert (watch, every second)"])
    finally:
        runtime.configure(None)
    print("\n".join(report(scores, args.days)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
