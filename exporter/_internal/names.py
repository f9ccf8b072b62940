"""Every metric, label, phase and outcome name of the project, spelled once.

Dashboards, alert rules, the collector and the docs all import from here, so a rename is one
edit and a test (tests/test_names.py) keeps docs/metrics.md in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# --- labels -------------------------------------------------------------------------------------
MODEL = "model"
ROUTE = "route"
TENANT = "tenant"
PROVIDER = "provider"
PHASE = "phase"
OUTCOME = "outcome"
QUANTILE = "quantile"
REASON = "reason"
LABEL = "label"
#: The upstream a call reached (UPSTREAM_REQUESTS): resolved address, region, fingerprint.
ADDRESS = "address"
REGION = "region"
FINGERPRINT = "fingerprint"

#: Value a label folds into past its cap (a tenant once its (model, route) holds
#: ``max_tenants`` tenants; a model, route or provider past ``max_models`` / ``max_routes`` /
#: ``max_providers``).
OTHER_TENANT = "__other__"
#: `label` of SELF_LABEL_FOLDS for a whole label set folded because its family reached
#: ``max_series`` rows.
FOLD_SERIES = "series"
#: `label` of SELF_LABEL_FOLDS for an upstream identity folded past ``labels.max_upstreams``.
FOLD_UPSTREAM = "upstream"
LABEL_FOLDS: tuple[str, ...] = (MODEL, ROUTE, PROVIDER, FOLD_SERIES, FOLD_UPSTREAM)
#: Value used when a label is unknown (no ``labels()`` context, no model in the request).
UNKNOWN = "unknown"

# --- phases (docs/metrics.md), in call order --------------------------------------------------
PHASES: tuple[str, ...] = ("queue", "connect", "send", "server", "prefill", "reasoning", "decode")

# --- outcomes ------------------------------------------------------------------------------------
OK = "ok"
ERROR = "error"
CANCELLED = "cancelled"
TIMEOUT = "timeout"
ABANDONED = "abandoned"
OUTCOMES: tuple[str, ...] = (OK, ERROR, CANCELLED, TIMEOUT, ABANDONED)

# --- token kinds ---------------------------------------------------------------------------------
CONTENT = "content"
REASONING = "reasoning"
TOOL = "tool"
TOKEN_KINDS: tuple[str, ...] = (CONTENT, REASONING, TOOL)

Unit = Literal["seconds", "tokens"]

#: Histograms hold integers: microseconds for times, counts for tokens.
US_PER_SECOND = 1_000_000


@dataclass(frozen=True)
class Family:
    """One histogram family: its exposition name, unit, help text and default label set.

    Values are recorded as integers (`scale` of a unit: microseconds for seconds) and served in
    the family's unit (`to_unit`). `windowed` families (the per-call user-facing ones, where a
    spike in Grafana must lead to the trace of a slow call) also serve sliding-window quantiles
    and carry exemplars.
    """

    name: str
    unit: Unit
    help: str
    tenant_by_default: bool
    extra_label: str | None = None
    windowed: bool = False

    @property
    def scale(self) -> int:
        """Recorded integers per unit: 1,000,000 µs a second, 1 token a token."""
        return US_PER_SECOND if self.unit == "seconds" else 1

    def to_unit(self, value: int) -> float:
        """A recorded integer in the family's unit (seconds or tokens)."""
        return value / US_PER_SECOND if self.unit == "seconds" else float(value)

    def from_unit(self, value: float) -> int:
        """A value in the family's unit as the recorded integer (bucket bounds, thresholds)."""
        return round(value * US_PER_SECOND) if self.unit == "seconds" else int(value)

    @property
    def window_name(self) -> str:
        """Name of the gauge family holding this histogram's sliding-window quantiles."""
        if self.unit == "seconds":
            return self.name.removesuffix("_seconds") + "_window_seconds"
        return self.name + "_window"


TTFT = Family(
    "llm_client_time_to_first_token_seconds", "seconds",
    "Time from the SDK call to the first output token of any kind.", True, windowed=True)
FIRST_ANSWER = Family(
    "llm_client_time_to_first_answer_token_seconds", "seconds",
    "Time from the SDK call to the first output token that is not reasoning.", True,
    windowed=True)
ITL = Family(
    "llm_client_inter_token_latency_seconds", "seconds",
    "Each gap between consecutive token events after the first.", False)
TPOT = Family(
    "llm_client_time_per_output_token_seconds", "seconds",
    "Per call: (last token - first token) / (output tokens - 1).", False)
STALL = Family(
    "llm_client_stream_stall_seconds", "seconds",
    "Per call: the largest gap between consecutive token events.", True, windowed=True)
DURATION = Family(
    "llm_client_request_duration_seconds", "seconds",
    "Time from the SDK call to the end of the response.", True, windowed=True)
PHASE_FAMILY = Family(
    "llm_client_phase_seconds", "seconds",
    "Time spent in each phase of the call (queue, connect, send, server, prefill, reasoning, "
    "decode).", False, extra_label=PHASE)
INPUT_TOKENS = Family(
    "llm_client_input_tokens", "tokens", "Input tokens per call, from the provider's usage.", False)
OUTPUT_TOKENS = Family(
    "llm_client_output_tokens", "tokens", "Output tokens per call, from the provider's usage.",
    False)
CACHED_INPUT_TOKENS = Family(
    "llm_client_cached_input_tokens", "tokens",
    "Input tokens per call served from the provider's prompt cache.", False)

HISTOGRAMS: tuple[Family, ...] = (
    TTFT, FIRST_ANSWER, ITL, TPOT, STALL, DURATION, PHASE_FAMILY,
    INPUT_TOKENS, OUTPUT_TOKENS, CACHED_INPUT_TOKENS,
)
HISTOGRAMS_BY_NAME: dict[str, Family] = {f.name: f for f in HISTOGRAMS}
WINDOWED: tuple[Family, ...] = tuple(f for f in HISTOGRAMS if f.windowed)

REQUESTS_TOTAL = "llm_client_requests_total"  # counter {outcome}; carries tenant by default
REQUESTS_IN_FLIGHT = "llm_client_requests_in_flight"  # gauge; model, route, provider

# --- what tells the four failure modes apart (docs/diagnose.md) ---------------------------------
#: Counters of the provider's usage per tenant (model, provider, route, tenant): a tenant's
#: cached share at the cost of two rows, where a tenant on the token histograms costs ~20 series.
USAGE_INPUT_TOKENS = "llm_client_usage_input_tokens_total"
USAGE_CACHED_INPUT_TOKENS = "llm_client_usage_cached_input_tokens_total"
USAGE_LABELS: tuple[str, ...] = (MODEL, PROVIDER, ROUTE, TENANT)
#: Calls by the upstream they reached: resolved address, region header, system fingerprint.
UPSTREAM_REQUESTS = "llm_client_upstream_requests_total"
UPSTREAM_LABELS: tuple[str, ...] = (ADDRESS, FINGERPRINT, MODEL, PROVIDER, REGION)
#: Response headers naming the region that answered (the first one present wins).
REGION_HEADERS: tuple[str, ...] = ("x-ms-region", "x-region")

# --- self-metrics --------------------------------------------------------------------------------
SELF_SERIES = "ttft_exporter_series"
SELF_TENANT_FOLDS = "ttft_exporter_tenant_folds_total"
SELF_LABEL_FOLDS = "ttft_exporter_label_folds_total"  # {label}
SELF_DROPS = "ttft_exporter_dropped_total"  # {reason}
SELF_SCRAPE_DURATION = "ttft_exporter_scrape_duration_seconds"
SELF_HTTP_CLOSED = "ttft_exporter_http_connections_closed_total"  # {reason}: limit, slow

# Reasons for a counted drop (label ``reason`` of SELF_DROPS).
DROP_SERIES_LIMIT = "series_limit"
DROP_BAD_VALUE = "bad_value"
DROP_BAD_LABEL = "bad_label"
DROP_INTERNAL = "internal_error"
DROP_REASONS: tuple[str, ...] = (DROP_SERIES_LIMIT, DROP_BAD_VALUE, DROP_BAD_LABEL, DROP_INTERNAL)

# Aggregator self-metrics (`ttft-exporter serve` receiving pushes from worker processes).
SELF_PUSH_REJECTED = "ttft_exporter_push_rejected_total"  # {reason}
SELF_PUSH_BATCHES = "ttft_exporter_push_batches_total"  # {result}
SELF_PUSH_WORKERS = "ttft_exporter_push_workers"
SELF_PUSH_LOST = "ttft_exporter_push_lost_batches_total"
SELF_PUSH_FAILURES = "ttft_exporter_push_failures_total"
SELF_SNAPSHOT_FAILURES = "ttft_exporter_snapshot_failures_total"
AGGREGATOR_SELF_METRICS: tuple[str, ...] = (
    SELF_PUSH_REJECTED, SELF_PUSH_BATCHES, SELF_PUSH_WORKERS, SELF_PUSH_LOST, SELF_PUSH_FAILURES,
    SELF_SNAPSHOT_FAILURES)
RESULT = "result"
# Reasons a push is rejected (label ``reason`` of SELF_PUSH_REJECTED), and results of the others.
REJECT_UNAUTHORIZED = "unauthorized"
REJECT_TOO_LARGE = "too_large"
REJECT_MALFORMED = "malformed"
REJECT_INCOMPATIBLE = "incompatible"
REJECT_REASONS: tuple[str, ...] = (REJECT_UNAUTHORIZED, REJECT_TOO_LARGE, REJECT_MALFORMED,
                                   REJECT_INCOMPATIBLE)
PUSH_APPLIED = "applied"
PUSH_DUPLICATE = "duplicate"
PUSH_RESULTS: tuple[str, ...] = (PUSH_APPLIED, PUSH_DUPLICATE)

# --- OpenTelemetry GenAI names (docs/tracing.md: which version of the conventions) ------------
OTEL_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
OTEL_TIME_PER_OUTPUT_CHUNK = "gen_ai.client.operation.time_per_output_chunk"
OTEL_OPERATION_DURATION = "gen_ai.client.operation.duration"
#: Token counters (they replace the `gen_ai.client.token.usage` histogram) ...
OTEL_USAGE_INPUT_TOKENS = "gen_ai.client.inference.usage.input_tokens"
OTEL_USAGE_OUTPUT_TOKENS = "gen_ai.client.inference.usage.output_tokens"
OTEL_USAGE_CACHE_READ_TOKENS = "gen_ai.client.inference.usage.cache_read.input_tokens"
OTEL_USAGE_REASONING_TOKENS = "gen_ai.client.inference.usage.reasoning.output_tokens"
#: ... and the per-operation token histograms.
OTEL_OPERATION_INPUT_TOKENS = "gen_ai.client.inference.operation.input_tokens"
OTEL_OPERATION_OUTPUT_TOKENS = "gen_ai.client.inference.operation.output_tokens"

# Span and metric attributes: the GenAI semantic conventions, then this project's own.
ATTR_OPERATION = "gen_ai.operation.name"
ATTR_PROVIDER = "gen_ai.provider.name"
ATTR_REQUEST_MODEL = "gen_ai.request.model"
ATTR_RESPONSE_MODEL = "gen_ai.response.model"
ATTR_REQUEST_STREAM = "gen_ai.request.stream"
ATTR_RESPONSE_ID = "gen_ai.response.id"
ATTR_FINISH_REASONS = "gen_ai.response.finish_reasons"
ATTR_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
ATTR_INPUT_TOKENS = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
ATTR_CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
ATTR_REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
ATTR_TOKEN_MODALITY = "gen_ai.token.modality"
ATTR_SERVER_ADDRESS = "server.address"
ATTR_SERVER_PORT = "server.port"
ATTR_ERROR_TYPE = "error.type"
ATTR_ROUTE = "ttft_exporter.route"
ATTR_TENANT = "ttft_exporter.tenant"
ATTR_OUTCOME = "ttft_exporter.outcome"
ATTR_TIME_TO_FIRST_ANSWER = "ttft_exporter.time_to_first_answer_token"
ATTR_STALL = "ttft_exporter.stream_stall"
ATTR_PHASE_PREFIX = "ttft_exporter.phase."  # + phase name, seconds

#: Span events at the phase boundaries, each at its real time (no per-chunk events).
SPAN_EVENTS: tuple[str, ...] = ("dispatched", "connected", "sent", "headers", "first_token",
                                "first_answer_token", "last_token")

# --- SLO counts served beside native histograms (protobuf exposition) ----------------------------
#: Latency objective (the config key of an SLO entry) -> the family its threshold applies to.
SLO_FAMILIES: dict[str, Family] = {"ttft": TTFT, "first_answer_token": FIRST_ANSWER,
                                   "stall": STALL}


def slo_calls_name(family: Family) -> str:
    """Counter of a family's calls at or under each SLO threshold (`le`; "+Inf": every call).

    Served with native histograms, which Prometheus stores without the classic `le` buckets, so
    SLO ratios stay exact counts (docs/decisions.md).
    """
    return family.name.removesuffix("_seconds") + "_slo_calls_total"
