"""The cause decision judged on scenarios nobody scripted (bench/scenarios.py): the real
`causes.classify` on the signals as diagnose reads them, over randomised worlds, incidents from
barely detectable to severe, two at once, and non-incidents that look like one.

Detection thresholds are chosen on the tuning seeds and every published figure is measured on
the held-out seeds (never the same scenarios for both):

    python -m bench.diagnose_eval [--tune 0:1500] [--held-out 100000:103600]

`make diagnose-eval` runs it and prints the markdown docs/diagnose.md quotes.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from bench.scenarios import FLOOR, INCIDENTS, LOOKALIKES, MAGNITUDE, scenario, windows
from exporter._internal.config.settings import DEFAULT_SECONDS_BUCKETS
from exporter._internal.diagnose.causes import classify
from exporter._internal.evidence.thresholds import DEFAULT, UNKNOWN
from exporter._internal.diagnose.noise import (from_cumulative, log_moments,
                                               rise_in_standard_errors)

COLUMNS: tuple[str | None, ...] = (None, UNKNOWN, *INCIDENTS)


@dataclass(frozen=True)
class Outcome:
    seed: int
    kind: str
    magnitude: float
    added: float
    named: str | None
    right: bool


def judge(seed: int) -> Outcome:
    s = scenario(seed)
    now, base = windows(s)  # sets s.magnitude
    found = classify("m", "r", now, base, DEFAULT)
    named = found.cause if found is not None else None
    return Outcome(seed, s.kind, s.magnitude, s.added, named, named in s.allowed)


def outcomes(seeds: range, workers: int = 2) -> list[Outcome]:
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(judge, seeds, chunksize=50))


def detection_thresholds(results: list[Outcome]) -> dict[str, float | None]:
    """Per cause, the smallest magnitude m such that the cause is named for at least 90 % of
    its incidents of magnitude m or more, and of magnitude m' or more for every larger m' with
    ten incidents or more above it (None: never). Incidents under the floor do not count."""
    out: dict[str, float | None] = {}
    for cause in INCIDENTS:
        mine = sorted((r.magnitude, r.named == cause) for r in results
                      if r.kind == cause and r.added >= FLOOR)
        found = None
        for i in range(len(mine) - 10, -1, -1):  # grow the tail while every tail holds
            tail = [hit for _, hit in mine[i:]]
            if sum(tail) < 0.9 * len(tail):
                break
            found = mine[i][0]
        out[cause] = found
    return out


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f} %" if b else "-"


def report(tuned: dict[str, float | None], held: list[Outcome], tune: range,
           held_out: range) -> list[str]:
    lines = [f"Magnitude of an incident: {MAGNITUDE}. Thresholds of detection chosen on seeds {tune.start}..{tune.stop - 1}; every "
             f"figure below measured on the held-out seeds {held_out.start}.."
             f"{held_out.stop - 1} ({len(held)} scenarios).", ""]
    kinds = [*INCIDENTS, "under the floor", "two incidents", *LOOKALIKES]
    lines += ["| scenario | n | " + " | ".join(c or "nothing" for c in COLUMNS) + " | right |",
              "| --- | ---: |" + " ---: |" * (len(COLUMNS) + 1)]
    for kind in kinds:
        rows = [r for r in held if (r.kind.startswith("two:") if kind == "two incidents"
                                    else r.kind in INCIDENTS and r.added < FLOOR
                                    if kind == "under the floor"
                                    else r.kind == kind and (r.added >= FLOOR
                                                             or kind not in INCIDENTS))]
        named = Counter(r.named for r in rows)
        lines.append(f"| {kind} | {len(rows)} | " + " | ".join(str(named[c]) for c in COLUMNS)
                     + f" | {_pct(sum(r.right for r in rows), len(rows))} |")
    lines += ["", "| cause | precision | detection threshold (tuning seeds) | "
              "recall at or above it (held out) |", "| --- | ---: | ---: | ---: |"]
    for cause in INCIDENTS:
        named = [r for r in held if r.named == cause]
        threshold = tuned[cause]
        above = [r for r in held if r.kind == cause and threshold is not None
                 and r.magnitude >= threshold and r.added >= FLOOR]
        lines.append(f"| `{cause}` | {_pct(sum(r.right for r in named), len(named))} "
                     f"({len(named)} named) | "
                     f"{'-' if threshold is None else format(threshold, '.3g')} | "
                     f"{_pct(sum(r.named == cause for r in above), len(above))} "
                     f"({len(above)}) |")
    calm = [r for r in held if r.kind == "calm"]
    false = sum(r.named is not None for r in calm)
    lookalike = [r for r in held if r.kind in LOOKALIKES and r.kind != "calm"]
    lines += ["", f"False findings on calm window pairs: {false} of {len(calm)} "
              f"({_pct(false, len(calm))}); a named cause on a look-alike non-incident: "
              f"{sum(not r.right for r in lookalike)} of {len(lookalike)} "
              f"({_pct(sum(not r.right for r in lookalike), len(lookalike))})."]
    return lines


def gate_false_rate(pairs: int = 4000, calls: int = 30, sigma: float = 1.0,
                    z: float = DEFAULT.degraded_z, seed: int = 20) -> tuple[float, float]:
    """Share of pairs of identical lognormal windows that pass the gate at `z`: the log-value
    gate from the buckets (noise.py), and the normal-spread gate it replaced ((p90 - p10) /
    2.563 of each window, from the same buckets)."""
    rng = np.random.default_rng(seed)
    bounds = DEFAULT_SECONDS_BUCKETS

    def buckets(x: np.ndarray) -> list[tuple[float, float]]:
        return [*((b, float(np.count_nonzero(x <= b))) for b in bounds), (math.inf, x.size)]

    def quantile(cumulative: list[tuple[float, float]], q: float) -> float:
        """Prometheus' histogram_quantile: linear inside the bucket."""
        rank, low, below = q * cumulative[-1][1], 0.0, 0.0
        for le, count in cumulative:
            if count >= rank:
                return low + (le - low) * (rank - below) / (count - below) if count > below \
                    else le
            low, below = le, count
        return low

    logged = spread = 0
    for _ in range(pairs):
        a, b = (rng.lognormal(math.log(0.3), sigma, calls) for _ in range(2))
        ca, cb = buckets(a), buckets(b)
        rise = rise_in_standard_errors(log_moments(from_cumulative(ca)),
                                       log_moments(from_cumulative(cb)))
        logged += rise is not None and rise >= z
        error = math.sqrt(sum(((quantile(c, 0.9) - quantile(c, 0.1)) / 2.563) ** 2 / calls
                              for c in (ca, cb)))
        spread += a.mean() - b.mean() >= z * error
    return logged / pairs, spread / pairs


def seed_range(text: str) -> range:
    """`A:B` on the command line: seeds A to B - 1."""
    start, stop = (int(x) for x in text.split(":"))
    return range(start, stop)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tune", type=seed_range, default=range(0, 1500))
    p.add_argument("--held-out", type=seed_range, default=range(100_000, 103_600))
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    tuned = detection_thresholds(outcomes(args.tune, args.workers))
    held = outcomes(args.held_out, args.workers)
    lines = report(tuned, held, args.tune, args.held_out)
    logged, spread = gate_false_rate()
    lines += ["", "The noise gate alone, on pairs of identical 30-call lognormal (σ = 1) windows "
              f"read from the classic buckets, passing at {DEFAULT.degraded_z:g} standard "
              f"errors: {100 * logged:.2f} % on log values (this gate), {100 * spread:.2f} % "
              "with the spread read as (p90 − p10) / 2.563 (the gate it replaced)."]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
