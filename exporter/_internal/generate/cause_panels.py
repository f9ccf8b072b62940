"""The overview's "Why is TTFT up?" row: the decision `ttft-exporter watch` serves, and the
signals it reads (causes.py), each now against its baseline, computed by the panels from the
exporter's series with the decision's own expressions (`Signal.expr`): Prometheus records
nothing for them, and a panel costs a query only while someone looks at it."""

from __future__ import annotations

from collections.abc import Sequence

from grafanalib import core

from .. import names
from ..evidence.thresholds import DEFAULT, RUNBOOK, UNKNOWN
from ..evidence.signals import CONNECT, IDENTITY, SIGNALS_BY_KEY
from ..promql import MODEL_ROUTE, by, duration, eq, regex, selector
from .grafana import Row
from .panels import Queries, target, timeseries, top

MR_LEGEND = "{{model}} {{route}}"


def new_upstream_share(window: str, offset: str, matchers: Sequence[str]) -> str:
    """Share of each (model, route)'s calls over `window` that reached an upstream identity
    with no calls over the same window `offset` earlier (diagnose/upstreams.py decides from the
    same counts). 0, not empty, when every upstream is known; empty without calls."""
    upstream = selector(names.UPSTREAM_REQUESTS, matchers)
    seen = f"increase({upstream}[{window}] offset {offset}) > 0"
    calls = f"increase({upstream}[{window}])"
    total = f"sum by ({by(MODEL_ROUTE)}) ({calls})"
    new = (f"sum by ({by(MODEL_ROUTE)}) (\n  {calls}\n  unless on "
           f"({by([*MODEL_ROUTE, *IDENTITY])})\n  {seen}\n)")
    return f"(\n{new}\nor 0 * {total}\n)\n/ ({total} > 0)"


def why_row(q: Queries) -> list[tuple[core.Panel, int]]:
    """A row of five panels: the likely cause, then prompt size, prompt cache, stalls and
    upstream (the signals of prefill_surge, cold_cache, noisy_neighbour, route_change)."""
    al = q.al
    window = duration(al.tenant_window_seconds * al.window_scale)
    offset = duration(al.tenant_baseline_offset_seconds * al.window_scale)
    mr = q.mr()
    vs = (f"now ({duration(al.tenant_window_seconds)}) / "
          f"{duration(al.tenant_baseline_offset_seconds)} ago")
    ago = duration(al.tenant_baseline_offset_seconds)

    def signal(key: str, matchers: Sequence[str], shift: str = "") -> str:
        return SIGNALS_BY_KEY[key].expr(window, matchers, MODEL_ROUTE, shift, mode=q.mode)

    def rise(key: str, *extra: str, k: int = 10) -> str:
        """now / the baseline; 1 (no change known) where the baseline has no value yet (less
        than `offset` of history), so the panel draws "now" from the start. No value where
        either side is undefined (a window without calls is NaN) or both are 0."""
        now, base = (signal(key, [*mr, *extra], shift) for shift in ("", offset))
        return top(f"((\n{now}\n) >= 0)\n/ (\n(\n{base}\n) > 0\nor\n(\n{now}\n) > 0\n)", k)

    cause = [regex(names.MODEL, "$model"), regex(names.ROUTE, "$route")]

    return [
        (Row(title="Why is TTFT up? (likely cause, and the signals that decide it)"), 24),
        (timeseries("Likely cause by model and route",
                    "The decision of ttft-exporter watch (LLMTTFTLikelyCause) where TTFT rose "
                    f"against {ago} ago: prefill_surge, cold_cache (with its tenant), "
                    "noisy_neighbour, route_change or unknown; `none` at 0 while no model "
                    "and route has one. `ttft-exporter diagnose` prints the numbers behind it.",
                    [target(f"{top(selector(names.LIKELY_CAUSE, cause))}\nor on ()\n"
                            "label_replace(vector(0), \"cause\", \"none\", \"\", \"\")",
                            "{{cause}} {{model}} {{route}} {{tenant}}")], "short",
                    q.runbook(RUNBOOK[UNKNOWN])), 24),
        (timeseries(f"Input tokens per call, {vs} (top 10)",
                    f"Above {DEFAULT.input_factor:g} with the prefill phase up: a prefill "
                    f"surge (longer prompts). 1 until {ago} of history exists.",
                    [target(rise("input_tokens"), MR_LEGEND)], "x",
                    q.runbook(RUNBOOK["prefill_surge"])), 6),
        (timeseries("Cached share of input tokens by tenant, now "
                    f"({duration(al.tenant_window_seconds)}) (lowest 10)",
                    "A tenant falling towards 0 while the others stay: its prompt cache went "
                    "cold.",
                    [target(top(signal("cached_share", mr), bottom=True),
                            "{{model}} {{tenant}}")], "percentunit",
                    q.runbook(RUNBOOK["cold_cache"])), 6),
        (timeseries(f"Largest stall per call (mean), {vs} (top 10)",
                    f"Above {DEFAULT.stall_factor:g} for every route of a model: a noisy "
                    f"neighbour in the provider's batch. 1 until {ago} of history exists.",
                    [target(rise("stall"), MR_LEGEND)], "x",
                    q.runbook(RUNBOOK["noisy_neighbour"])), 6),
        (timeseries("Calls to a new upstream (share), connect phase "
                    f"{vs} (top 5 each)",
                    "Share of a route's calls that reached an address, region or fingerprint "
                    f"with no calls {ago} ago; and the connect phase's rise. Either: a "
                    "route change.",
                    [target(top(new_upstream_share(window, offset, mr), 5),
                            "new upstream " + MR_LEGEND),
                     target(rise("phase", eq(names.PHASE, CONNECT), k=5),
                            "connect " + MR_LEGEND)], "x",
                    q.runbook(RUNBOOK["route_change"])), 6),
    ]


