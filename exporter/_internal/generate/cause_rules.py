"""`LLMTTFTLikelyCause`: the alert that names the likely cause of a TTFT rise.

The decision is not written in PromQL: `ttft-exporter watch` (diagnose/watch.py) runs
`diagnose`'s decision every interval and serves `llm_ttft_likely_cause{model,route,cause,tenant}
1` per finding; the alert selects that series, one rule per cause so each tells on-call what
its cause means. The alert and `ttft-exporter diagnose` cannot disagree: one decision makes
both. alerts/tests/causes.yaml checks the rules with promtool, tests/test_incident_day.py the
alert against diagnose on a real Prometheus.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import names
from ..config.settings import Config
from ..evidence.thresholds import (CAUSES, COLD_CACHE, NOISY_NEIGHBOUR, PREFILL_SURGE,
                                   ROUTE_CHANGE, RUNBOOK, UNKNOWN)
from ..promql import duration, eq, selector

#: What on-call is told per cause (README's table, issue 14), for the alert's description.
TOLD = {
    PREFILL_SURGE: "TTFT rose with prompt size on route {{ $labels.route }}: input tokens per "
                   "call and the prefill phase are up; decode is normal.",
    COLD_CACHE: "The prompt cache of tenant {{ $labels.tenant }} went cold (after idling?): its "
                "cached share of input tokens fell and its TTFT rose; other tenants' did not.",
    NOISY_NEIGHBOUR: "Every tenant of model {{ $labels.model }} stalls mid-stream at once: a "
                     "noisy neighbour in the provider's batch, not your prompts.",
    ROUTE_CHANGE: "Traffic for model {{ $labels.model }} now goes somewhere else: a new "
                  "upstream (address, region or fingerprint) or a slower connect; model time "
                  "is unchanged.",
    UNKNOWN: "TTFT rose but the signals fit none of the four known failure modes: check the "
             "client side (CPU, event loop) and the provider's status.",
}


def cause_alerts(config: Config, alert: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """`LLMTTFTLikelyCause`, one rule per cause (label `cause`), each telling on-call what
    that cause means; `alert` is alerts._alert."""
    al = config.alerting
    window = duration(al.tenant_window_seconds)
    offset = duration(al.tenant_baseline_offset_seconds)
    where = "model {{ $labels.model }} on route {{ $labels.route }}"
    out = []
    for cause in CAUSES:
        rule = alert(
            "LLMTTFTLikelyCause", "ticket", selector(names.LIKELY_CAUSE, [eq("cause", cause)]),
            duration(120 * al.window_scale), f"TTFT up on {where}: likely {cause}",
            f"{TOLD[cause]} Decided by ttft-exporter watch from the last {window} against the "
            f"same window {offset} earlier (ttft-exporter diagnose gives the numbers; the "
            f"runbook section {RUNBOOK[cause]!r} what to do).", config)
        rule["labels"]["cause"] = cause
        out.append(rule)
    return out
