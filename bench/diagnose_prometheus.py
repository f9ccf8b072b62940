"""The generator's scenarios end to end: recorded into the exporter, scraped by a real
Prometheus (classic and native histograms), named by the real `ttft-exporter diagnose`.

bench/diagnose_eval.py runs `causes.classify` on the signals bench/scenarios.py computes from
each scenario's calls. Here the same calls (`scenarios.draw`: the same seed, the same random
sequence) become `CallTimeline`s recorded into one exporter, each scenario its own model
(`g<seed>`, route `r`), so many run at once; two Prometheus servers scrape it every second;
`ttft-exporter diagnose --json` compares the two windows; and each scenario's cause through
Prometheus is set beside the direct one and the allowed ones:

    python -m bench.diagnose_prometheus --seeds 100000:100100   (make diagnose-prometheus)

Per scenario, three direct readings of the same calls tell why a cause through Prometheus can
differ from the generator's:
- `direct`: `classify` on `scenarios.windows` (what bench/diagnose_eval.py counts);
- `prefill_read`: ...with the prefill phase the exporter's: headers to first token, which
  holds the first decode step (`scenarios.calls` keeps it apart from the prefill);
- `recorded`: ...and the tenants past `labels.max_tenants` per (model, route) merged into one
  `__other__`, as the exporter folds them: the signals as the exporter records them.

How the run keeps Prometheus' reading exact, and what it cannot:
- Scenario time: a window's calls are scaled to at most MAX_CALLS (`window_seconds` below 300
  s where a route is busy), then recorded over WALL seconds of wall time.
- A series is born inside a window (every scenario's model, a tenant's first call, the new
  upstream of a route change): the exporter shows each scraper a new series at zero first
  (expose/debut.py), so `rate()` counts its first calls too.
- Each window is bounded by two scrapes, the first before its first call, the second after its
  last: `--at`, `--since`, `--baseline` and `--baseline-at` are those scrapes' timestamps (in
  ms). `rate()` over a window with samples at both ends extrapolates nothing: rate × window is
  the exact increase. A whole-second window a user types extrapolates about one scrape
  interval of calls at its edges.
- Both Prometheus servers scrape from one address: each sends its own `scraper` parameter,
  or the first to scrape would use up every new series' zero for both.
- A failed scrape (a 1 s timeout on a loaded machine) can use up a zero Prometheus never
  stored: a run with one is repeated (RUN_TENANTS and RUN_CALLS keep runs small enough).
- Native histograms (Prometheus 2.42): `rate()` extrapolates a native series born inside a
  window back to the window's start (the floor that stops a counter's extrapolation at its
  zero is not applied to them), so calls read up to one scrape interval / window more there;
  the usage counters' ratios (uncached tokens per call) divide by those calls. The report
  names it where the calls read differ.
- `labels.max_series` is raised so that every scenario's series fit in one exporter (the
  default, 20,000, is one deployment's ceiling); `labels.max_tenants` (100) and
  `labels.max_upstreams` stay the defaults: their folds are real paths.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bench.diagnose_eval import seed_range
from bench.scenarios import SEND, Calls, draw, scenario, windows
from exporter._internal import runtime
from exporter._internal.config.settings import LabelConfig
from exporter._internal.demo.prometheus import PrometheusProcess
from exporter._internal.diagnose.causes import Window, classify
from exporter._internal.evidence.thresholds import DEFAULT
from exporter._internal.diagnose.run import Prometheus
from exporter._internal.record.timeline import CallTimeline

#: Calls per window at most: scenario time is scaled down for busier routes.
MAX_CALLS = 1500
#: Seconds of wall time each window's calls are spread over (then the run waits for a
#: successful scrape, which bounds the window).
WALL = 5.0
SCRAPE = 1.0
#: Tenant series and calls of one exporter's run at most: the tenant families' classic
#: buckets of ~1,800 tenants are 29 MB of text, which the exporter does not render within a
#: 1 s scrape timeout on a shared 2-core machine while it records ~5,000 calls a second;
#: more scenarios run in more batches.
RUN_TENANTS = 200
RUN_CALLS = 10_000
#: Calls a (model, route) needs in each window: the same on both sides.
MIN_CALLS = DEFAULT.min_calls
MODES = {"classic": (), "native": ("--enable-feature=native-histograms",)}
ROUTE = "r"
JOB = "ttft-exporter"
#: The tenant id the direct reading gives tenants the exporter folds.
FOLDED = 10**9
CONFIG = {"labels": {"max_series": 1_000_000}}


@dataclass
class Case:
    """One scenario: its calls, and the causes named on them directly."""

    seed: int
    kind: str
    allowed: frozenset[str | None]
    window_seconds: float
    now: Calls
    base: Calls
    #: distinct tenants with calls, and those the exporter keeps (the rest fold)
    tenants: int
    kept: frozenset[int]
    direct: str | None
    prefill_read: str | None
    recorded: str | None

    @property
    def model(self) -> str:
        return f"g{self.seed}"


def _cause(now: Window, base: Window) -> str | None:
    found = classify("m", ROUTE, now, base, replace(DEFAULT, min_calls=MIN_CALLS))
    return None if found is None else found.cause


def as_recorded(c: Calls, kept: frozenset[int] | None = None) -> Calls:
    """The calls as the exporter measures them: the prefill phase ends at the first token (it
    holds the first decode), and tenants not `kept` share one `__other__` (None: none fold)."""
    tenant = c.tenant if kept is None else \
        np.where(np.isin(c.tenant, list(kept)), c.tenant, FOLDED)
    return replace(c, prefill=c.ttft - c.queue - c.connect - SEND - c.server, tenant=tenant)


def prepare(seed: int, max_tenants: int = LabelConfig().max_tenants) -> Case:
    """Scenario `seed` scaled to MAX_CALLS calls a window at most, and its direct causes."""
    s = scenario(seed)
    rate = s.route.rate * max(1.0, s.effect.rate_factor)
    s.window_seconds = min(s.window_seconds, MAX_CALLS / rate)
    now_calls, base_calls = draw(s)
    direct = _cause(*windows(s, (now_calls, base_calls)))
    # the exporter keeps a (model, route)'s first `max_tenants` tenants, in recording order
    order = np.concatenate((base_calls.tenant, now_calls.tenant))
    seen = order[np.sort(np.unique(order, return_index=True)[1])].tolist()
    kept = frozenset(seen[:max_tenants])
    prefill_read = _cause(*windows(s, (as_recorded(now_calls), as_recorded(base_calls))))
    recorded = _cause(*windows(s, (as_recorded(now_calls, kept),
                                   as_recorded(base_calls, kept))))
    return Case(seed, s.kind, s.allowed, s.window_seconds, now_calls, base_calls, len(seen),
                kept, direct, prefill_read, recorded)


def timeline(c: Calls, i: int, model: str, end_ns: int) -> CallTimeline:
    """Call `i` of `c` as the exporter's instrumentation stamps it, ending at `end_ns`: queue,
    connect, send, server wait, then prefill and the first decode up to the first token; the
    largest stall is the one gap to the second token."""
    def ns(x: float) -> int:
        return round(x * 1e9)

    ttft = ns(c.ttft[i])
    start = end_ns - ttft - ns(c.stall[i])
    t = CallTimeline(start=start, model=model, provider="generated", route=ROUTE,
                     tenant=f"t{c.tenant[i]}")
    t.dispatched = start + ns(c.queue[i])
    t.connected = t.dispatched + ns(c.connect[i])
    t.sent = t.connected + ns(SEND)
    t.headers = t.sent + ns(c.server[i])
    t.token(start + ttft)
    t.token(end_ns)
    t.end = end_ns
    t.outcome = "ok"
    t.input_tokens, t.cached_input_tokens = int(c.input_tokens[i]), int(c.cached[i])
    t.output_tokens = 2
    t.upstream_address, t.upstream_region, t.fingerprint = c.upstream
    return t


def feed(cases: list[Case], now: bool, wall: float = WALL) -> tuple[float, float]:
    """Record one window's calls of every scenario spread evenly over `wall` seconds; the
    wall-clock times of the first and last call."""
    recorder = runtime.state().recorder
    schedule = sorted(((j + 0.5) / c.ttft.size * wall, k, j)
                      for k, c in enumerate(case.now if now else case.base for case in cases)
                      for j in range(c.ttft.size))
    started, first = time.perf_counter(), time.time()
    i = 0
    while i < len(schedule):
        elapsed = time.perf_counter() - started
        while i < len(schedule) and schedule[i][0] <= elapsed:
            _, k, j = schedule[i]
            case = cases[k]
            recorder.record_call(timeline(case.now if now else case.base, j, case.model,
                                          time.perf_counter_ns()))
            i += 1
        time.sleep(0.005)
    return first, time.time()


def scrapes(prom: Prometheus, at: float, ok: bool = True) -> list[tuple[int, float]]:
    """(timestamp in ms, scrape duration in s) of the exporter's successful (`ok`) or failed
    scrapes in the 5 minutes before `at`."""
    def samples(expr: str) -> dict[int, float]:
        rows = prom.query(f'{expr}{{job="{JOB}"}}[5m]', at)
        return {round(float(ts) * 1000): float(v) for ts, v in rows[0]["values"]} if rows \
            else {}

    up = samples("up")
    return sorted((ts, took) for ts, took in samples("scrape_duration_seconds").items()
                  if (up.get(ts) == 1) == ok)


def scraped(proms: dict[str, Prometheus], after: float, timeout: float = 60.0) -> None:
    """Wait until every Prometheus holds a successful scrape started after `after` (under
    load a 1 s scrape of a large exposition can time out: the next one bounds the span)."""
    deadline = time.monotonic() + timeout
    for prom in proms.values():
        while not any(ts / 1000 > after for ts, _ in scrapes(prom, time.time())):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no successful scrape after {after:.3f} in {timeout:g} s")
            time.sleep(0.2)


def bounds(samples: list[tuple[int, float]], after: float, first: float, last: float
           ) -> tuple[int, int]:
    """The window (ms) of the calls recorded from `first` to `last`: the last scrape that
    started after `after` (the previous span's last call) and ended before `first`, and the
    first scrape that started after `last`. A scrape's exposition is taken somewhere between
    its start and its end."""
    before = [ts for ts, took in samples if ts / 1000 > after and ts / 1000 + took < first]
    after = [ts for ts, _ in samples if ts / 1000 > last]
    if not before or not after:
        raise RuntimeError(f"no scrape bounds the span {first:.3f}..{last:.3f}")
    return max(before), min(after)


def run_diagnose(url: str, base: tuple[int, int], now: tuple[int, int]
                 ) -> dict[str, dict[str, Any]]:
    """The real CLI over the two windows: its finding per model (models not degraded are
    absent)."""
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "diagnose", "--prometheus", url, "--json",
         "--at", f"{now[1] / 1000:.3f}", "--since", f"{now[1] - now[0]}ms",
         "--baseline", f"{base[1] - base[0]}ms", "--baseline-at", f"{base[1] / 1000:.3f}",
         "--min-calls", str(MIN_CALLS)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"diagnose failed: {proc.stderr}")
    return {f["model"]: f for f in json.loads(proc.stdout) if f["route"] == ROUTE}


def scrape_config(target: str, scraper: str) -> str:
    """Scrape `target` every SCRAPE seconds as scraper `scraper`: both servers scrape from one
    address, and the exporter shows a new series at zero once per scraper (expose/debut.py)."""
    return (f"global:\n  scrape_interval: {SCRAPE:g}s\n"
            f"scrape_configs:\n  - job_name: {JOB}\n    params:\n      scraper: [{scraper}]\n"
            f'    static_configs:\n      - targets: ["{target}"]\n')


@contextmanager
def exporter(modes: tuple[str, ...]) -> Iterator[dict[str, Prometheus]]:
    """The in-process exporter and one Prometheus per histogram mode scraping it every
    second, each up; the query clients by mode."""
    runtime.configure(CONFIG)
    server = runtime.start_http_server(port=0)
    target = server.url.split("//", 1)[1].split("/", 1)[0]
    with ExitStack() as stack:
        stack.callback(runtime.configure, None)
        stack.callback(server.stop)
        proms = {mode: Prometheus(stack.enter_context(PrometheusProcess(
            scrape_config(target, mode), extra_flags=MODES[mode])).url) for mode in modes}
        deadline = time.monotonic() + 60
        while not all(p.query(f'up{{job="{JOB}"}} == 1', time.time()) for p in proms.values()):
            if time.monotonic() > deadline:
                raise RuntimeError("Prometheus never scraped the exporter")
            time.sleep(0.25)
        yield proms


@dataclass
class Run:
    """One exporter's run: per mode, the finding diagnose gave per seed (None: not degraded),
    and the scrapes that failed between the baseline's first scrape and the diagnosed
    window's last."""

    findings: dict[str, dict[int, dict[str, Any] | None]]
    failed: dict[str, int]


def through_prometheus(cases: list[Case], modes: tuple[str, ...] = tuple(MODES)) -> Run:
    """The scenarios' calls recorded, scraped and diagnosed in one run."""
    with exporter(modes) as proms:
        base_span = feed(cases, now=False)
        scraped(proms, base_span[1])
        now_span = feed(cases, now=True)
        scraped(proms, now_span[1])
        run = Run({}, {})
        for mode, prom in proms.items():
            samples = scrapes(prom, time.time())
            base, now = bounds(samples, 0.0, *base_span), bounds(samples, base_span[1], *now_span)
            run.failed[mode] = sum(base[0] < ts < now[1]
                                   for ts, _ in scrapes(prom, time.time(), ok=False))
            found = run_diagnose(prom.url, base, now)
            run.findings[mode] = {c.seed: found.get(c.model) for c in cases}
        return run


def batches(cases: list[Case], tenants: int = RUN_TENANTS, calls: int = RUN_CALLS
            ) -> Iterator[list[Case]]:
    """The scenarios in runs of at most `tenants` tenant series and `calls` calls (at least
    one scenario a run)."""
    run: list[Case] = []
    for case in cases:
        grown = (*run, case)
        if run and (sum(len(c.kept) for c in grown) > tenants or
                    sum(c.now.ttft.size + c.base.ttft.size for c in grown) > calls):
            yield run
            run = []
        run.append(case)
    if run:
        yield run


@dataclass
class Evaluation:
    """Per mode, per seed: the finding through Prometheus; the runs repeated after a failed
    scrape, and the seeds whose last run still had one (per mode)."""

    findings: dict[str, dict[int, dict[str, Any] | None]]
    repeated: int
    failed: dict[str, set[int]]

    @property
    def named(self) -> dict[str, dict[int, str | None]]:
        """Per mode, per seed: the cause named (None: not degraded)."""
        return {mode: {seed: f and f["cause"] for seed, f in found.items()}
                for mode, found in self.findings.items()}


def evaluate(cases: list[Case], modes: tuple[str, ...] = tuple(MODES), tries: int = 3
             ) -> Evaluation:
    """`through_prometheus` a batch at a time. A failed scrape can lose the first calls of a
    series born in it (its zero debut may be used up by a body Prometheus dropped): a batch
    with one is run again, up to `tries` times in all."""
    out = Evaluation({mode: {} for mode in modes}, 0, {mode: set() for mode in modes})
    runs = list(batches(cases))
    for k, batch in enumerate(runs, 1):
        for attempt in range(tries):
            print(f"run {k}/{len(runs)}: seeds {batch[0].seed}..{batch[-1].seed}, try "
                  f"{attempt + 1}", file=sys.stderr, flush=True)
            run = through_prometheus(batch, modes)
            if not any(run.failed.values()):
                break
            if attempt < tries - 1:
                out.repeated += 1
        for mode in modes:
            out.findings[mode].update(run.findings[mode])
            if run.failed[mode]:
                out.failed[mode].update(c.seed for c in batch)
    return out


# --- the report -------------------------------------------------------------------------------

def _name(cause: str | None) -> str:
    return cause or "nothing"


def reason(case: Case, finding: dict[str, Any] | None, failed: bool) -> str:
    """Why `finding` (through Prometheus) names another cause than the direct reading
    (`failed`: a scrape failed in its run's windows, every try)."""
    why = ["a scrape failed in its run"] if failed else []
    if case.prefill_read != case.direct:
        why.append("the prefill phase holds the first decode")
    if case.recorded != case.prefill_read:
        why.append(f"{case.tenants - len(case.kept)} tenants folded into __other__")
    if (finding and finding["cause"]) != case.recorded:
        evidence = (finding or {}).get("evidence", {})
        read = [f"{key} {evidence[f'calls_{key}']:g} for {calls.ttft.size}"
                for key, calls in (("now", case.now), ("baseline", case.base))
                if abs(evidence.get(f"calls_{key}", calls.ttft.size) - calls.ttft.size) > 0.5]
        why.append(f"Prometheus read the calls as {', '.join(read)}" if read else
                   "Prometheus read the calls' signals otherwise")
    return "; ".join(why)


def report(cases: list[Case], result: Evaluation) -> list[str]:
    named, failed = result.named, result.failed
    modes = list(named)
    seeds = f"{cases[0].seed}..{cases[-1].seed}" if cases else "none"
    scaled = [c for c in cases if c.window_seconds < 300]
    lines = [f"Seeds {seeds} ({len(cases)} scenarios; {len(scaled)} scaled to "
             f"{MAX_CALLS} calls a window, {min((c.window_seconds for c in scaled), default=0):.0f}"
             f"-{max((c.window_seconds for c in scaled), default=0):.0f} s of scenario time "
             f"instead of 300 s), min calls {MIN_CALLS}; windows of {WALL:g} s wall time, "
             f"scraped every {SCRAPE:g} s.", ""]
    lines += ["| scenario | n | " + " | ".join(f"{m}: same as direct" for m in modes)
              + " | right, direct | " + " | ".join(f"right, {m}" for m in modes) + " |",
              "| --- | ---: |" + " ---: |" * (1 + 2 * len(modes))]
    kinds = sorted({c.kind if not c.kind.startswith("two:") else "two incidents"
                    for c in cases})
    groups = [(k, [c for c in cases if (c.kind.startswith("two:") if k == "two incidents"
                                        else c.kind == k)]) for k in kinds]
    for kind, rows in [*groups, ("all", cases)]:
        same = [sum(named[m][c.seed] == c.direct for c in rows) for m in modes]
        right = [sum(named[m][c.seed] in c.allowed for c in rows) for m in modes]
        label = f"**{kind}**" if kind == "all" else kind
        lines.append(f"| {label} | {len(rows)} | " + " | ".join(str(x) for x in same)
                     + f" | {sum(c.direct in c.allowed for c in rows)} | "
                     + " | ".join(str(x) for x in right) + " |")
    differ = [(c, m) for c in cases for m in modes if named[m][c.seed] != c.direct]
    lines += ["", f"Differing from the direct cause: {len(differ)}"
              + (":" if differ else "."), ""]
    if differ:
        lines += ["| seed | scenario | mode | direct | through Prometheus | allowed | why |",
                  "| ---: | --- | --- | --- | --- | --- | --- |"]
        for c, m in differ:
            lines.append(f"| {c.seed} | {c.kind} | {m} | {_name(c.direct)} | "
                         f"{_name(named[m][c.seed])} | "
                         f"{'yes' if named[m][c.seed] in c.allowed else 'no'} | "
                         f"{reason(c, result.findings[m][c.seed], c.seed in failed[m])} |")
    folds = Counter(c.tenants > len(c.kept) for c in cases)
    lines += ["", f"Scenarios with tenants folded into `__other__` (more than "
              f"{LabelConfig().max_tenants} on the route): {folds[True]}. Runs repeated "
              f"after a failed scrape: {result.repeated}; scenarios read with a failed scrape "
              "still: " + ", ".join(f"{m} {len(result.failed[m])}" for m in modes) + "."]
    lines += [f"Read with a failed scrape ({m}): {', '.join(map(str, sorted(result.failed[m])))}."
              for m in modes if result.failed[m]]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=seed_range, default=range(100_000, 100_040))
    p.add_argument("--modes", default=",".join(MODES), help="classic,native")
    args = p.parse_args(argv)
    cases = [prepare(seed) for seed in args.seeds]
    result = evaluate(cases, tuple(args.modes.split(",")))
    print("\n".join(report(cases, result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
