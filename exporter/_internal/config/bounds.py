"""The bound of every config value that can be checked alone, declared once.

Three readers take them from here: the loader checks values against them (`ttft-exporter
check-config`, `configure()`), `schema.py` writes them as JSON Schema for the Helm chart's
`values.schema.json`, and `ttft-exporter generate` lists them in docs/reference/config.md. So
the package, the chart and the docs accept the same values. Checks that relate two values
(buckets strictly increasing, an SLO threshold within `histograms.max_seconds`, a TLS key with
its certificate) cannot be said per value; they stay in the loader (`RELATIONS` names them for
the reference).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .. import names


@dataclass(frozen=True)
class Bound:
    """What one value (or each item of a list, for a path ending in `[]`) must be."""

    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # exclusive minimum
    below: float | None = None  # exclusive maximum
    choices: tuple[Any, ...] = ()
    #: A JSON Schema (ECMA 262) regular expression, searched: anchor it with ^ and $.
    pattern: str = ""
    min_length: int = 0  # of a string, or of a list
    #: The reason said instead of the one derived from the numbers (patterns need one).
    why: str = ""

    def accepts(self, value: Any) -> bool:
        if isinstance(value, str):
            if self.pattern and not re.search(self.pattern.replace("$", r"\Z"), value):
                return False
            return len(value) >= self.min_length and (not self.choices or value in self.choices)
        if isinstance(value, tuple):
            return len(value) >= self.min_length
        if self.choices:
            return value in self.choices
        return ((self.minimum is None or value >= self.minimum)
                and (self.maximum is None or value <= self.maximum)
                and (self.above is None or value > self.above)
                and (self.below is None or value < self.below))

    def reason(self) -> str:
        """`must be ...`, as the loader reports it and the reference lists it."""
        if self.why:
            return f"{self.why}: {', '.join(self.choices)}" if self.choices else self.why
        if self.choices:
            return f"must be one of {', '.join(str(c) for c in self.choices)}"
        if self.min_length:
            return "must not be empty"
        lo, hi = self.minimum, self.maximum
        if lo is not None and hi is not None:
            return f"must be between {_number(lo)} and {_number(hi)}"
        if self.above is not None and self.below is not None:
            return f"must be strictly between {_number(self.above)} and {_number(self.below)}"
        low = ("must be positive" if self.above == 0 else
               f"must be greater than {_number(self.above)}" if self.above is not None else
               "must not be negative" if lo == 0 else
               f"must be at least {_number(lo)}" if lo is not None else "")
        return f"{low} and at most {_number(hi)}" if hi is not None else low

    def json_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in (("minimum", self.minimum), ("maximum", self.maximum),
                           ("exclusiveMinimum", self.above), ("exclusiveMaximum", self.below)):
            if value is not None:
                out[key] = value
        if self.choices:
            out["enum"] = list(self.choices)
        if self.pattern:
            out["pattern"] = self.pattern
        return out


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


AT_LEAST_1 = Bound(minimum=1)
POSITIVE = Bound(above=0)
NOT_EMPTY = Bound(min_length=1)
SHARE = Bound(above=0, maximum=1)  # a share of calls or tenants, (0, 1]
PROBABILITY = Bound(above=0, below=1)  # SLO targets, quantiles
FACTOR = Bound(above=1)
UP_TO_AN_HOUR = Bound(above=0, maximum=3600)
#: Objectives of an SLO entry (`slos[].ttft`...): the same keys in each.
OBJECTIVES = ("ttft", "first_answer_token", "stall", "errors")

#: Key path -> bound. `[]` stands for every item of a list.
BOUNDS: dict[str, Bound] = {
    "server.port": Bound(minimum=0, maximum=65535,
                         why="must be between 0 (any free port) and 65535"),
    "server.max_connections": AT_LEAST_1,
    "server.max_connections_per_client": AT_LEAST_1,
    "server.header_timeout_seconds": UP_TO_AN_HOUR,
    "server.body_timeout_seconds": UP_TO_AN_HOUR,
    "server.write_timeout_seconds": UP_TO_AN_HOUR,
    "server.max_unread_responses": AT_LEAST_1,
    "server.reserved_connections": Bound(minimum=0),
    "labels.tenant_policy": Bound(choices=("raw", "hash", "allowlist")),
    **{f"labels.{key}": AT_LEAST_1 for key in ("max_tenants", "max_series", "max_models",
                                               "max_routes", "max_providers", "max_upstreams",
                                               "max_tasks")},
    "labels.max_label_length": Bound(minimum=8),
    "labels.expire_seconds": Bound(minimum=0),
    "labels.tenant_families[]": Bound(
        choices=tuple(f.name for f in names.HISTOGRAMS if names.MODEL in f.base),
        why="must be a histogram family of LLM calls"),
    "histograms.significant_digits": Bound(choices=(1, 2, 3)),
    "histograms.max_seconds": AT_LEAST_1,
    "histograms.max_tokens": Bound(minimum=1000),
    "histograms.native_schema": Bound(minimum=-4, maximum=8,
                                      why="must be between -4 and 8 (Prometheus' exponential "
                                          "schemas)"),
    "histograms.native_max_buckets": Bound(minimum=8),
    "histograms.seconds_buckets": NOT_EMPTY,
    "histograms.seconds_buckets[]": POSITIVE,
    "histograms.token_buckets": NOT_EMPTY,
    "histograms.token_buckets[]": POSITIVE,
    "window.seconds": AT_LEAST_1,
    "window.slices": Bound(minimum=1, maximum=60),
    "window.quantiles[]": PROBABILITY,
    **{f"slos[].{objective}.target": PROBABILITY for objective in OBJECTIVES},
    **{f"slos[].{objective}.threshold_seconds": POSITIVE for objective in OBJECTIVES[:3]},
    **{f"alerting.{key}": NOT_EMPTY for key in ("exporter_job", "page_severity",
                                                "ticket_severity", "service")},
    "alerting.runbook_url": Bound(pattern="^https?://", why="must be an absolute http(s) URL"),
    "alerting.group_by[]": Bound(pattern="^[a-zA-Z_][a-zA-Z0-9_]*$",
                                 why="must be a label name"),
    "alerting.selector": Bound(pattern="^[^{}]*$", why="label matchers only, without braces"),
    "alerting.min_calls": AT_LEAST_1,
    "alerting.slo_period_seconds": Bound(minimum=86400, why="must be at least a day (86400)"),
    **{f"alerting.{key}": POSITIVE for key in ("window_scale", "regression_offset_seconds",
                                               "tenant_window_seconds",
                                               "tenant_baseline_offset_seconds")},
    "alerting.regression_min_seconds": Bound(minimum=0),
    "alerting.regression_factor": FACTOR,
    "alerting.tenant_degraded_factor": FACTOR,
    **{f"alerting.{key}": SHARE for key in ("many_tenants_share", "task_deadline_overrun_share",
                                            "truncation_share")},
    "alerting.many_tenants_min": AT_LEAST_1,
    "alerting.top_tenants": AT_LEAST_1,
    "alerting.dashboard_refresh": Bound(pattern="^[1-9][0-9]*[smhd]$",
                                        why="must be a Grafana interval such as 30s or 1m"),
    "dashboards.histograms": Bound(choices=("classic", "native")),
    "push_url": Bound(pattern="^(https?://|$)", why="must be an http:// or https:// URL"),
    "push.interval_seconds": UP_TO_AN_HOUR,
    "push.timeout_seconds": UP_TO_AN_HOUR,
    "push.exit_timeout_seconds": Bound(minimum=0, maximum=60),
    "push.max_pending_bytes": Bound(minimum=2**16),
    "aggregator.max_body_bytes": Bound(minimum=2**10),
    "aggregator.gauge_ttl_seconds": Bound(minimum=0),
    "aggregator.max_workers": AT_LEAST_1,
    "aggregator.snapshot_interval_seconds": POSITIVE,
    "aggregator.durability": Bound(choices=("process", "machine")),
    "aggregator.metrics_username": Bound(pattern="^[^:]*$", why="must not contain ':'"),
}

#: The checks between values, which only the loader makes (the chart's schema cannot).
RELATIONS: tuple[str, ...] = (
    "`histograms.seconds_buckets` and `histograms.token_buckets` strictly increasing",
    "the largest of `histograms.seconds_buckets` at most `histograms.max_seconds`",
    "every SLO `threshold_seconds` at most `histograms.max_seconds`",
    "no two `slos` entries with the same `model` and `route`",
    "`aggregator.max_decompressed_bytes` at least `aggregator.max_body_bytes`",
    "`aggregator.tls_cert_file` with `aggregator.tls_key_file`, "
    "`aggregator.metrics_username` with `aggregator.metrics_password_file` (both or neither)",
)
