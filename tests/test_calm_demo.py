"""A calm demo never pages, and its panels draw what they say (issue 21, items 4 and 6).

The calm demo (`ttft-exporter demo --no-incidents`) and a real Prometheus running the rules
generated from the demo's config run in the background from the start of the session
(tests/support/calm_run.py, started by tests/conftest.py); these tests run last, after at least
five minutes of it, and read what Prometheus recorded over the whole run.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from exporter._internal import names, promql
from tests.support.calm_run import SCRAPE, CalmRun
from tests.support.prometheus import grafana_expr

#: The calm demo runs at least this long before it is judged (s).
MIN_SECONDS = 320
#: Range-query step (s): what Grafana uses over a few minutes (its minimum, the scrape interval).
STEP = SCRAPE
#: Seconds a query may take: Prometheus runs niced, beside the whole suite.
SLOW = 120
ROOT = Path(__file__).resolve().parent.parent
#: The pick of a "top N" time series: the N ranked over the whole range (panels.top).
TOP_PICK = re.compile(r"(?:topk|bottomk)\((\d+), (?:max|last)_over_time\(")


def _window(run: CalmRun) -> tuple[float, float]:
    ran = run.wait_until(MIN_SECONDS)
    assert run.demo.poll() is None, f"the demo exited:\n{run.demo_log()}"
    end = time.time()
    return end - ran, end


def _expr(expr: str, seconds: float) -> str:
    """A panel's query as Grafana sends it over the run: its range, its interval (the step) and
    rate interval (max(step + scrape interval, 4 scrape intervals)), variables at All."""
    return grafana_expr(expr, f"{max(STEP + SCRAPE, 4 * SCRAPE)}s", f"{int(seconds)}s",
                        f"{STEP}s")


def _panels(directory: Path) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(directory.glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        out += [(f"{board['title']} / {p['title']}", p) for p in board["panels"]
                if p.get("type") == "timeseries"]
    return out


def _by_route(result: list[dict[str, Any]], *extra: str) -> dict[tuple[str, ...], float]:
    return {(*(r["metric"].get(k, "") for k in (names.MODEL, names.ROUTE, *extra)),):
            round(float(r["value"][1]), 4) for r in result}


def test_a_calm_demo_never_pages(calm_run: CalmRun) -> None:
    start, end = _window(calm_run)
    prom = calm_run.prom
    ran = f"{int(end - start)}s"
    calls = _by_route(prom.query(f"sum by (model, route) "
                                 f"(increase({names.REQUESTS_TOTAL}[{ran}]))", timeout=SLOW))
    # each objective's miss ratio over the whole run (its 1h window holds all of it)
    missed = _by_route(prom.query(f"{promql.sli_record(3600)} > 0", timeout=SLOW), "sli")
    firing = prom.query_range('ALERTS{alertstate="firing"}', start, end, STEP, SLOW)
    pending = prom.query_range('ALERTS{alertstate="pending"}', start, end, STEP, SLOW)
    facts = (f"calls: {calls}\nmiss ratios over the run: {missed}\n"
             f"pending at some point: {[a['metric']['alertname'] for a in pending]}")
    print(facts)  # the measured figures, with -s
    assert not firing, f"alerts fired in a calm demo: {[a['metric'] for a in firing]}\n" \
        f"{facts}\n{calm_run.demo_log()}"
    broken = [(r["name"], r.get("lastError")) for g in prom.rules(SLOW) for r in g["rules"]
              if r["health"] == "err"]
    assert not broken
    # The run is real: every model and route made calls and the SLO rules judged each ...
    assert len(calls) >= 9 and min(calls.values()) >= 5, facts
    judged = prom.query(f'count by (model, route) ({promql.sli_record(300)}{{sli="ttft"}})',
                        timeout=SLOW)
    assert len(judged) >= 9, judged
    # ... and met every objective well under the page's burn, also where too few calls were
    # made for an alert to judge (alerting.min_calls): the fleet meets its objectives.
    page = promql.PAGE_BURN[0].factor * (1 - 0.99)
    assert all(ratio < page for ratio in missed.values()), facts


def test_no_top_n_panel_draws_more_than_n_series(calm_run: CalmRun) -> None:
    start, end = _window(calm_run)
    drawn: dict[str, tuple[int, int, int]] = {}
    for title, panel in _panels(ROOT / "dashboards"):
        for t in panel["targets"]:
            if "topk(" not in t["expr"] and "bottomk(" not in t["expr"]:
                continue
            picks = TOP_PICK.findall(t["expr"])
            assert picks, f"{title}: a top N picked anew at each step"
            n = int(picks[-1])
            expr = _expr(t["expr"], end - start)
            series = calm_run.prom.query_range(expr, start, end, STEP, timeout=SLOW)
            assert len(series) <= n, (title, n, [s["metric"] for s in series])
            # for the record: what a plain topk at each step draws over the same range
            kind = "bottomk" if "bottomk(" in t["expr"] else "topk"
            plain = f"{kind}({n}, {expr.split(chr(10) + 'and' + chr(10))[0]})"
            anew = calm_run.prom.query_range(plain, start, end, STEP, timeout=SLOW)
            drawn[f"{title} [{t['refId']}]"] = (n, len(series), len(anew))
    print("top N panels, (N, series drawn, series of a plain topk):", drawn)
    assert len(drawn) >= 20


def test_calm_panels_say_none_and_show_now(calm_run: CalmRun) -> None:
    """The cause panel says "none" (not "No data"); a panel comparing now with an hour ago
    shows now before an hour of history exists (1: no change known)."""
    start, end = _window(calm_run)
    panels = dict(_panels(calm_run.dashboards))
    last_minute = end - 60

    def drawn(title: str) -> list[dict[str, Any]]:
        [(_, panel)] = [(k, p) for k, p in panels.items() if k.endswith(" / " + title)]
        return calm_run.prom.query_range(_expr(panel["targets"][0]["expr"], end - start),
                                         last_minute, end, STEP, timeout=SLOW)

    cause = drawn("Likely cause by model and route")
    assert [s["metric"] for s in cause] == [{"cause": "none"}], cause
    assert all(float(v) == 0 for _, v in cause[0]["values"])
    for title in ("Input tokens per call, now (5m) / 1h ago (top 10)",
                  "Largest stall per call (mean), now (5m) / 1h ago (top 10)"):
        series = drawn(title)
        assert len(series) >= 3, (title, series)
        assert all(float(v) == 1 for s in series for _, v in s["values"]), (title, series)
