"""The overview's "Why is TTFT up?" row: the decision of the rules and the four signals it
reads, side by side (causes.py, cause_rules.py), each now against its baseline."""

from __future__ import annotations

from grafanalib import core

from .. import names
from ..diagnose.causes import CONNECT, RUNBOOK, UNKNOWN
from ..promql import eq, selector
from .cause_rules import LIKELY_CAUSE, SignalNames
from .grafana import Row
from .panels import Queries, target, timeseries, top

MR_LEGEND = "{{model}} {{route}}"


def why_row(q: Queries) -> list[tuple[core.Panel, int]]:
    """A row of five panels: the likely cause, then prompt size, prompt cache, stalls and
    upstream (the signals of prefill_surge, cold_cache, noisy_neighbour, route_change)."""
    n, mr = SignalNames(q.al), q.recorded()
    model_only = [m for m in mr if not m.startswith(names.ROUTE)]
    vs = f"now ({n.window}) / {n.offset} ago"

    def rise(key: str, *extra: str, k: int = 10) -> str:
        """now / the baseline; 1 (no change known) where the baseline has no value yet (less
        than `offset` of history), so the panel draws "now" from the start. No value where
        either side is undefined (a window without calls records NaN) or both are 0."""
        now, base = (selector(name, [*mr, *extra]) for name in (n.now(key), n.base(key)))
        return top(f"({now} >= 0)\n/ (\n  {base} > 0\n  or\n  {now} > 0\n)", k)

    return [
        (Row(title="Why is TTFT up? (likely cause, and the signals that decide it)"), 24),
        (timeseries("Likely cause by model and route",
                    "The rules' decision (LLMTTFTLikelyCause) where TTFT rose against "
                    f"{n.offset} ago: prefill_surge, cold_cache (with its tenant), "
                    "noisy_neighbour, route_change or unknown; `none` at 0 while no model "
                    "and route has one. `ttft-exporter diagnose` prints the numbers behind it.",
                    [target(f"{top(selector(LIKELY_CAUSE, mr))}\nor on ()\n"
                            "label_replace(vector(0), \"cause\", \"none\", \"\", \"\")",
                            "{{cause}} {{model}} {{route}} {{tenant}}")], "short",
                    q.runbook(RUNBOOK[UNKNOWN])), 24),
        (timeseries(f"Input tokens per call, {vs} (top 10)",
                    "Above 1.5 with the prefill phase up: a prefill surge (longer prompts). 1 "
                    f"until {n.offset} of history exists.",
                    [target(rise("input_tokens"), MR_LEGEND)], "x",
                    q.runbook(RUNBOOK["prefill_surge"])), 6),
        (timeseries(f"Cached share of input tokens by tenant, now ({n.window}) (lowest 10)",
                    "A tenant falling towards 0 while the others stay: its prompt cache went "
                    "cold.",
                    [target(top(selector(n.now("cached_share"), model_only), bottom=True),
                            "{{model}} {{tenant}}")], "percentunit",
                    q.runbook(RUNBOOK["cold_cache"])), 6),
        (timeseries(f"Largest stall per call (mean), {vs} (top 10)",
                    "Above 2 for every route of a model: a noisy neighbour in the provider's "
                    f"batch. 1 until {n.offset} of history exists.",
                    [target(rise("stall"), MR_LEGEND)], "x",
                    q.runbook(RUNBOOK["noisy_neighbour"])), 6),
        (timeseries("Calls to a new upstream (share), connect phase "
                    f"{vs} (top 5 each)",
                    "Share of a model's calls that reached an address, region or fingerprint "
                    f"with no calls {n.offset} ago; and the connect phase's rise. Either: a "
                    "route change.",
                    [target(top(selector(n.upstream, model_only), 5), "new upstream {{model}}"),
                     target(rise("phase", eq(names.PHASE, CONNECT), k=5),
                            "connect " + MR_LEGEND)], "x",
                    q.runbook(RUNBOOK["route_change"])), 6),
    ]


