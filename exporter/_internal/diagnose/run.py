"""`ttft-exporter diagnose`: name the failure mode behind a TTFT rise, from a real Prometheus.

It reads the signals of causes.py over two windows through Prometheus' HTTP API (instant
queries of `rate(...[window])` at each window's end), so it needs no recording rules and works
on any Prometheus that scrapes the exporter. The decision itself is `causes.classify`; this
module only fetches the numbers, groups them by (model, route) and prints the findings.

Errors the user can fix (Prometheus unreachable, an API error, a bad argument) raise
`DiagnoseError`, which the command line prints as one line with exit status 2.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import names
from ..compat import fromisoformat
from ..config.settings import AlertingConfig
from ..promql import CLASSIC, MODEL_ROUTE, NATIVE, HistogramMode, by, duration, eq, selector
from .causes import Finding, Window, classify
from ..evidence.signals import CONNECT, IDENTITY, OPENED, SCALARS, SIGNALS, SIGNALS_BY_KEY
from ..evidence.thresholds import DEFAULT, Thresholds
from .baseline import Candidates, choose
from .noise import from_cumulative, log_moments, opened
from .upstreams import new_upstream_shares

#: The families whose log values the noise gate reads (noise.py), by the decision's key; the
#: phase family's connect phase only.
LOGGED: dict[str, tuple[names.Family, tuple[str, ...]]] = {
    "ttft": (names.TTFT, ()), "first_answer": (names.FIRST_ANSWER, ()),
    "input_tokens": (names.INPUT_TOKENS, ()),
    CONNECT: (names.PHASE_FAMILY, (eq(names.PHASE, CONNECT),)),
}


class DiagnoseError(Exception):
    """A problem the user can fix; its message is the one line printed."""


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus-style duration (`15m`, `1h30m`, `90s`)."""
    parts = _DURATION.findall(text)
    if not parts or "".join(a + b for a, b in parts) != text.strip():
        raise DiagnoseError(f"not a duration: {text!r} (use e.g. 15m, 1h, 90s)")
    seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    if seconds < 1:
        raise DiagnoseError(f"duration too short: {text!r} (at least 1s)")
    return seconds


def parse_time(text: str) -> float:
    """Unix seconds of `text`: a number, or an RFC 3339 / ISO 8601 time with its zone."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise DiagnoseError(f"not a time: {text!r} (unix seconds or RFC 3339)") from None
    if parsed.tzinfo is None:
        raise DiagnoseError(f"time without a zone: {text!r} (add Z or +01:00)")
    return parsed.timestamp()


class Prometheus:
    """Instant queries over Prometheus' HTTP API (`/api/v1/query`)."""

    def __init__(self, url: str, timeout: float = 10.0):
        if not re.match(r"https?://", url):
            raise DiagnoseError(f"--prometheus must be an http(s) URL, got {url!r}")
        try:
            urllib.parse.urlsplit(url).port  # a port that is no number raises here
        except ValueError:
            raise DiagnoseError(f"--prometheus has a bad port: {url!r}") from None
        self.url = url.rstrip("/")
        self.timeout = timeout

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """The result vector of `expr` at unix time `at`."""
        body = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"}).encode()
        request = urllib.request.Request(self.url + "/api/v1/query", data=body)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                doc = json.loads(response.read())
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read()).get("error", e.reason)
            except ValueError:
                detail = e.reason
            raise DiagnoseError(f"Prometheus at {self.url} answered HTTP {e.code}: "
                                f"{detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise DiagnoseError(f"cannot query Prometheus at {self.url}: {reason}") from None
        except http.client.HTTPException as e:  # a listener that does not speak HTTP
            said = " ".join(str(e).split())[:80]  # the peer's bytes, on one line
            raise DiagnoseError(f"Prometheus at {self.url} does not answer HTTP: "
                                f"{type(e).__name__} {said!r}") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            error = doc.get("error", doc) if isinstance(doc, dict) else doc
            raise DiagnoseError(f"Prometheus at {self.url}: {error}")
        data = doc.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list):
            said = " ".join(json.dumps(doc).split())[:120]
            raise DiagnoseError(f"Prometheus at {self.url} answered success without a "
                                f"data.result list (is it Prometheus' API?): {said}")
        return result


@dataclass(frozen=True)
class Request:
    """What to compare: the window ending `at` (`since` long) with the `baseline` window
    ending `baseline_at` (default: where the first starts)."""

    at: float
    since: float
    baseline: float
    baseline_at: float | None = None
    model: str | None = None
    route: str | None = None
    #: extra PromQL matchers every query selects (the watch: the rules' job and selector)
    matchers: tuple[str, ...] = ()
    #: baseline windows to choose from, each `Candidates.step` before the last (baseline.py)
    candidates: int = 3

    def __post_init__(self) -> None:
        """The baseline must end before the diagnosed window starts: an overlap compares a
        window with itself, an inverted pair compares the future with the past."""
        start = self.at - self.since
        if self.baseline_end > start + 1e-6:
            raise DiagnoseError(
                f"the baseline ({_clock(self.baseline_end - self.baseline)} to "
                f"{_clock(self.baseline_end)}) must end by the start of the diagnosed window "
                f"({_clock(start)} to {_clock(self.at)}): move --baseline-at or --at")

    @property
    def baseline_end(self) -> float:
        return self.at - self.since if self.baseline_at is None else self.baseline_at

    @property
    def baselines(self) -> Candidates:
        """The baseline windows to choose from: the one given, then the same length further
        back by its offset from `at` (or by its length, where that is longer: no overlap)."""
        return Candidates(self.baseline_end, self.baseline,
                          max(self.at - self.baseline_end, self.baseline), self.candidates)


def stored_mode(prom: Prometheus, at: float, matchers: Sequence[str]) -> HistogramMode:
    """How Prometheus stores the TTFT histogram: classic where it has the classic series (also
    beside native ones), else native. No TTFT series at all is an error: nothing to
    diagnose."""
    inner = ", ".join(matchers)
    for mode in (CLASSIC, NATIVE):
        if prom.query(f"count(last_over_time({mode.presence(names.TTFT)}{{{inner}}}[1h]))", at):
            return mode
    where = f" matching {{{inner}}}" if inner else ""
    raise DiagnoseError(f"Prometheus at {prom.url} has no {names.TTFT.name} series{where} in "
                        f"the hour before {_clock(at)}: is it scraping the exporter?")


def _windows(prom: Prometheus, at: float, window: float, matchers: Sequence[str],
             mode: HistogramMode, pool: ThreadPoolExecutor) -> dict[tuple[str, str], Window]:
    """Every signal over `window` seconds ending at `at`, per (model, route)."""
    dur = duration(window)
    futures = {s.key: pool.submit(prom.query, s.expr(dur, matchers, MODEL_ROUTE, mode=mode), at)
               for s in SIGNALS}
    logged = {key: pool.submit(prom.query, mode.bucket_rate(family, MODEL_ROUTE, dur,
                                                            [*matchers, *extra]), at)
              for key, (family, extra) in LOGGED.items()}
    out: dict[tuple[str, str], Window] = {}
    #: per-model signal -> model -> tenant -> value
    per_model: dict[str, dict[str, dict[str, float]]] = {}
    for key, future in futures.items():
        for row in future.result():
            if SIGNALS_BY_KEY[key].per_model:
                models = per_model.setdefault(key, {})
                tenants = models.setdefault(row["metric"].get(names.MODEL, ""), {})
                tenants[row["metric"].get(names.TENANT, "")] = float(row["value"][1])
                continue
            labels, value = row["metric"], float(row["value"][1])
            w = out.setdefault((labels.get(names.MODEL, ""), labels.get(names.ROUTE, "")),
                               Window())
            if key in SCALARS:
                setattr(w, key, value)
            elif key == "phase":
                w.phases[labels.get(names.PHASE, "")] = value
            else:
                getattr(w, key)[labels.get(names.TENANT, "")] = value
    for (model, _), w in out.items():
        for key, models in per_model.items():
            setattr(w, key, models.get(model, {}))
    for key, future in logged.items():
        for route, buckets in _buckets(future.result(), window).items():
            if route not in out:
                continue
            for name, part in ((key, buckets), *(((OPENED, opened(buckets)),)
                                                  if key == CONNECT else ())):
                moments = log_moments(part)
                if moments is not None:
                    out[route].logs[name] = moments
    return out


def _buckets(rows: list[dict[str, Any]], window: float
             ) -> dict[tuple[str, str], list[tuple[float, float, float]]]:
    """Calls per (lower, upper) bucket over the window, per (model, route), from a bucket
    rate query's rows: classic ones per `le` (cumulative), native ones a histogram each."""
    classic: dict[tuple[str, str], list[tuple[float, float]]] = {}
    out: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for row in rows:
        labels = row["metric"]
        route = (labels.get(names.MODEL, ""), labels.get(names.ROUTE, ""))
        if "histogram" in row:
            out[route] = [(float(low), float(high), float(rate) * window)
                          for _, low, high, rate in row["histogram"][1].get("buckets", [])]
        else:
            classic.setdefault(route, []).append(
                (float(labels.get("le", "+Inf")), float(row["value"][1]) * window))
    for route, cumulative in classic.items():
        out[route] = from_cumulative(cumulative)
    return out


def diagnose(prom: Prometheus, req: Request, thresholds: Thresholds = DEFAULT,
             alerting: AlertingConfig = AlertingConfig()) -> list[Finding]:
    """The findings, one per degraded (model, route), sorted by model and route."""
    matchers = [*req.matchers, *(eq(label, value) for label, value in
                                 ((names.MODEL, req.model), (names.ROUTE, req.route)) if value)]
    mode = stored_mode(prom, req.at, matchers)
    upstreams = selector(names.UPSTREAM_REQUESTS, matchers)

    def identities(window: float) -> str:
        return f"sum by ({by((*MODEL_ROUTE, *IDENTITY))}) (increase({upstreams}[{duration(window)}]))"

    candidates = req.baselines
    with ThreadPoolExecutor(max_workers=8) as pool:
        upstream_now = pool.submit(prom.query, identities(req.since), req.at)
        chosen = pool.submit(choose, prom.query, candidates, matchers, mode, thresholds)
        now = _windows(prom, req.at, req.since, matchers, mode, pool)
        picks = chosen.result()
        ends = {candidates.end(i) for i in {0, *picks.values()}}
        upstream_base = {end: pool.submit(prom.query, identities(req.baseline), end)
                         for end in ends}
        bases = {end: _windows(prom, end, req.baseline, matchers, mode, pool) for end in ends}
        identities_base = {end: _identities(f.result()) for end, f in upstream_base.items()}
    now_identities = _identities(upstream_now.result())
    shares = {end: new_upstream_shares(now_identities, rows)
              for end, rows in identities_base.items()}
    findings = []
    for (model, route), window in sorted(now.items()):
        pick = picks.get((model, route), 0)
        end = candidates.end(pick)
        window.new_upstream_share = shares[end].get((model, route))
        found = classify(model, route, window, bases[end].get((model, route), Window()),
                         thresholds, alerting)
        if found is not None:
            found.evidence["baseline_windows_back"] = pick
            findings.append(found)
    return findings


def _identities(rows: list[dict[str, Any]]) -> dict[tuple[str, ...], float]:
    """Calls per (model, route, address, region, fingerprint) from an upstream query."""
    return {tuple(row["metric"].get(label, "") for label in (*MODEL_ROUTE, *IDENTITY)):
            float(row["value"][1]) for row in rows}


def table(findings: list[Finding], req: Request) -> str:
    """The findings as text for a terminal: one block per (model, route)."""
    span = (f"last {duration(req.since)} to {_clock(req.at)} vs {duration(req.baseline)} "
            f"to {_clock(req.baseline_end)}")
    if not findings:
        return f"TTFT not degraded anywhere ({span})."
    lines = [f"{len(findings)} degraded (model, route) ({span}):", ""]
    for f in findings:
        who = ", ".join(f.tenants) if f.tenants else "all tenants"
        lines.append(f"{f.model} / {f.route}: {f.cause}  ({who})")
        for key in sorted({k.rsplit("_", 1)[0] for k in f.evidence
                           if k.endswith(("_now", "_baseline"))}):
            now, was = f.evidence.get(f"{key}_now"), f.evidence.get(f"{key}_baseline")
            lines.append(f"    {key:<42} {_num(now):>10}  (baseline {_num(was)})")
        for key, value in f.evidence.items():
            if not key.endswith(("_now", "_baseline")):
                lines.append(f"    {key:<42} {_num(value):>10}")
        lines.append(f"    runbook: {f.runbook}")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else format(x, ".4g")


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
