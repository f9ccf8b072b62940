"""The signals the cause decision reads (diagnose/causes.py): each a number per (model, route[, tenant]
[, phase]) over a window, and the PromQL that computes it from the exporter's histograms and
usage counters, in either histogram mode. run.py queries them; the watch, the baseline choice
and the generated cause panels read the same definitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import names
from ..promql import HistogramMode, by, over, regex, selector

#: The phases the decision reads (retry: for evidence).
RETRY, QUEUE, CONNECT, SERVER, PREFILL = "retry", "queue", "connect", "server", "prefill"
PHASES = (RETRY, QUEUE, CONNECT, SERVER, PREFILL)
#: The phases a route's network makes: a farther host adds round trips to both.
NETWORK = (CONNECT, SERVER)
#: `reason` of the retries that are the provider's (llm_client_retries_total): it refused or
#: failed an attempt. A timeout or a broken connection may be the client's own.
PROVIDER_RETRIES = (names.RETRY_RATE_LIMITED, names.RETRY_OVERLOADED, names.RETRY_SERVER_ERROR)
#: The connect phase of the calls that opened a connection (Window.logs).
OPENED = "connect_opened"

@dataclass(frozen=True)
class Signal:
    """One number per (model, route[, tenant][, phase]) over a window: `kind` says how it is
    computed from `family` (a histogram mean) or from the usage counters (a ratio)."""

    key: str
    #: "mean" (histogram sum / count), "calls" (count increase),
    #: "cached_share" (cached / all input tokens), "cached_per_call" (cached tokens / calls),
    #: "uncached_per_call" (input tokens the cache did not serve / calls),
    #: "retries_per_call" (the provider's retries / calls)
    kind: str
    family: names.Family | None = None
    tenant: bool = False
    phase: bool = False
    per_model: bool = False  # over all routes of the model (no route label)

    def expr(self, window: str, matchers: Sequence[str], keep: Sequence[str],
             offset: str = "", *, mode: HistogramMode) -> str:
        """PromQL of the signal over `window` (shifted back by `offset`), by `keep` (plus
        tenant or phase where the signal has them), reading histograms stored in `mode`."""
        labels = [*(k for k in keep if not (self.per_model and k == names.ROUTE)),
                  *([names.TENANT] if self.tenant else []),
                  *([names.PHASE] if self.phase else [])]
        m = [*matchers, *([regex(names.PHASE, "|".join(PHASES))] if self.phase else [])]
        grouped = f"sum by ({by(labels)})"
        span = over(window, offset)
        if self.kind == "retries_per_call":
            retried = selector(names.RETRIES.name, [*m, regex(names.REASON,
                                                               "|".join(PROVIDER_RETRIES))])
            calls = f"{grouped} ({mode.rate(names.TTFT, 'count', m, window, offset)})"
            return f"{grouped} (rate({retried}{span}))\n/ ({calls} > 0)"
        if self.kind == "uncached_per_call":
            given = f"{grouped} (rate({selector(names.USAGE_INPUT_TOKENS, m)}{span}))"
            cached = f"{grouped} (rate({selector(names.USAGE_CACHED_INPUT_TOKENS, m)}{span}))"
            calls = f"{grouped} ({mode.rate(names.TTFT, 'count', m, window, offset)})"
            return f"({given} - ({cached} or 0 * {given}))\n/ ({calls} > 0)"
        if self.kind in ("cached_share", "cached_per_call"):
            cached = selector(names.USAGE_CACHED_INPUT_TOKENS, m)
            if self.kind == "cached_share":
                total = f"rate({selector(names.USAGE_INPUT_TOKENS, m)}{span})"
            else:
                total = mode.rate(names.TTFT, "count", m, window, offset)
            return f"{grouped} (rate({cached}{span}))\n/ ({grouped} ({total}) > 0)"
        assert self.family is not None
        count = f"{grouped} ({mode.rate(self.family, 'count', m, window, offset)})"
        if self.kind == "calls":
            return f"{count} * {_seconds(window)}"
        total = f"{grouped} ({mode.rate(self.family, 'sum', m, window, offset)})"
        return f"{total}\n/ ({count} > 0)"


def _seconds(window: str) -> str:
    """A PromQL duration's seconds (rate × seconds = the increase, without increase()'s
    extrapolation quirks differing from rate's)."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    for unit in ("ms", "s", "m", "h", "d", "w"):
        if window.endswith(unit) and window[:-len(unit)].isdigit():
            return format(int(window[:-len(unit)]) * units[unit], "g")
    raise ValueError(f"not a single-unit duration: {window}")


SIGNALS: tuple[Signal, ...] = (
    Signal("calls", "calls", names.TTFT),
    Signal("ttft", "mean", names.TTFT),
    Signal("first_answer", "mean", names.FIRST_ANSWER),
    Signal("input_tokens", "mean", names.INPUT_TOKENS),
    Signal("stall", "mean", names.STALL),
    Signal("tpot", "mean", names.TPOT),
    Signal("output_tokens", "mean", names.OUTPUT_TOKENS),
    Signal("phase", "mean", names.PHASE_FAMILY, phase=True),
    Signal("tenant_calls", "calls", names.TTFT, tenant=True),
    Signal("tenant_ttft", "mean", names.TTFT, tenant=True),
    Signal("cached_share", "cached_share", tenant=True, per_model=True),
    Signal("cached_per_call", "cached_per_call", tenant=True, per_model=True),
    Signal("tenant_model_calls", "calls", names.TTFT, tenant=True, per_model=True),
    Signal("uncached_per_call", "uncached_per_call"),
    Signal("tenant_uncached_per_call", "uncached_per_call", tenant=True),
    Signal("route_cached_share", "cached_share"),
    Signal("route_cached_per_call", "cached_per_call"),
    Signal("retries_per_call", "retries_per_call"),
)
#: The signals that are one number per (model, route) (Window's attributes of the same name).
SCALARS = tuple(s.key for s in SIGNALS if not (s.tenant or s.phase))
SIGNALS_BY_KEY = {s.key: s for s in SIGNALS}

#: The labels of one upstream identity (llm_client_upstream_requests_total).
IDENTITY = (names.ADDRESS, names.REGION, names.FINGERPRINT)
