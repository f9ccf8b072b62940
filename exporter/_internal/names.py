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
TASK = "task"
KIND = "kind"
DEADLINE = "deadline"
FINISH_REASON = "finish_reason"

#: Value a label folds into past its cap (a tenant once its (model, route) holds
#: ``max_tenants`` tenants; a model, route, provider or task past ``max_models`` /
#: ``max_routes`` / ``max_providers`` / ``max_tasks``).
OTHER_TENANT = "__other__"
#: `label` of SELF_LABEL_FOLDS for a whole label set folded because its family reached
#: ``max_series`` rows.
FOLD_SERIES = "series"
#: `label` of SELF_LABEL_FOLDS for an upstream identity folded past ``labels.max_upstreams``.
FOLD_UPSTREAM = "upstream"
LABEL_FOLDS: tuple[str, ...] = (MODEL, ROUTE, PROVIDER, TASK, FOLD_SERIES, FOLD_UPSTREAM)
#: Value used when a label is unknown (no ``labels()`` context, no model in the request).
UNKNOWN = "unknown"

# --- phases (docs/metrics.md), in call order --------------------------------------------------
PHASES = ("retry", "queue", "connect", "send", "server", "prefill", "reasoning", "decode")

# --- outcomes ------------------------------------------------------------------------------------
OK = "ok"
#: The provider refused the request as the caller's mistake (a 4xx other than 408 and 429:
#: bad request, authentication, not found, unprocessable, too large).
CLIENT_ERROR = "client_error"
#: The provider said "too many requests" (429): the caller's quota, told apart from a failure.
RATE_LIMITED = "rate_limited"
#: The provider failed or was overloaded (5xx, Anthropic's 529, an error event mid-stream).
PROVIDER_ERROR = "provider_error"
TIMEOUT = "timeout"
#: The connection could not be made or broke (refused, reset, cut mid-stream).
CONNECTION_ERROR = "connection_error"
#: Any other exception: none of the classes above recognised it.
ERROR = "error"
CANCELLED = "cancelled"
ABANDONED = "abandoned"
OUTCOMES: tuple[str, ...] = (OK, CLIENT_ERROR, RATE_LIMITED, PROVIDER_ERROR, TIMEOUT,
                             CONNECTION_ERROR, ERROR, CANCELLED, ABANDONED)
#: The outcomes that are the provider's failures (or may be: an unrecognised exception): the
#: error objective and its pages count these; the caller's own (client_error, rate_limited,
#: cancelled, abandoned) never spend the provider's budget.
PROVIDER_FAILURES: tuple[str, ...] = (PROVIDER_ERROR, TIMEOUT, CONNECTION_ERROR, ERROR)
#: `reason` of RETRIES: what ended an attempt the client retried (docs/metrics.md, retry_reason).
RETRY_REASONS: tuple[str, ...] = ("rate_limited", "overloaded", "server_error", "timeout",
                                  "connection", "other")
RETRY_RATE_LIMITED, RETRY_OVERLOADED, RETRY_SERVER_ERROR, RETRY_TIMEOUT, RETRY_CONNECTION, \
    RETRY_OTHER = RETRY_REASONS

# --- token kinds ---------------------------------------------------------------------------------
CONTENT = "content"
REASONING = "reasoning"
TOOL = "tool"
TOKEN_KINDS: tuple[str, ...] = (CONTENT, REASONING, TOOL)

# --- agent tasks (docs/metrics.md, "Agent tasks") -------------------------------------------------
#: `kind` of llm_client_task_time_seconds: an LLM call's time split three ways, tool and
#: guardrail blocks, and the task's time covered by none of them (the app's own code).
KIND_QUEUE = "queue"
KIND_NETWORK = "network"
KIND_PROVIDER = "provider"
KIND_TOOL = "tool"
KIND_GUARDRAIL = "guardrail"
KIND_APP = "app"
TASK_KINDS: tuple[str, ...] = (KIND_QUEUE, KIND_NETWORK, KIND_PROVIDER, KIND_TOOL,
                               KIND_GUARDRAIL, KIND_APP)
#: `deadline` of llm_client_tasks_total.
DEADLINE_NONE = "none"
DEADLINE_MET = "met"
DEADLINE_EXCEEDED = "exceeded"
DEADLINE_OUTCOMES: tuple[str, ...] = (DEADLINE_NONE, DEADLINE_MET, DEADLINE_EXCEEDED)
#: Header carrying a deadline between services: the whole milliseconds left (shim/deadline.py).
DEADLINE_HEADER = "ttft-deadline-ms"
#: Header in which OpenAI (and compatible servers) report their own processing time (ms).
PROCESSING_HEADER = "openai-processing-ms"

#: `finish_reason` of llm_client_finish_reasons_total: each provider's stop reasons in five
#: values; `length` is a stop at max_tokens (OpenAI `length`, Responses `max_output_tokens`,
#: Anthropic `max_tokens`).
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_TOOL_CALLS = "tool_calls"
FINISH_CONTENT_FILTER = "content_filter"
FINISH_OTHER = "other"
FINISH_REASONS: tuple[str, ...] = (FINISH_STOP, FINISH_LENGTH, FINISH_TOOL_CALLS,
                                   FINISH_CONTENT_FILTER, FINISH_OTHER)
_FINISH_ALIASES = {
    "stop": FINISH_STOP, "end_turn": FINISH_STOP, "stop_sequence": FINISH_STOP,
    "completed": FINISH_STOP, "length": FINISH_LENGTH, "max_tokens": FINISH_LENGTH,
    "max_output_tokens": FINISH_LENGTH, "model_context_window_exceeded": FINISH_LENGTH,
    "tool_calls": FINISH_TOOL_CALLS, "function_call": FINISH_TOOL_CALLS,
    "tool_use": FINISH_TOOL_CALLS, "content_filter": FINISH_CONTENT_FILTER,
    "refusal": FINISH_CONTENT_FILTER,
}


def finish_reason(raw: str) -> str:
    """A provider's stop reason as one of FINISH_REASONS."""
    return _FINISH_ALIASES.get(raw, FINISH_OTHER)


Unit = Literal["seconds", "tokens", "count"]

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
    #: The labels every series carries (tenant and `extra_label` come on top).
    base: tuple[str, ...] = (MODEL, PROVIDER, ROUTE)
    #: For a family with one value per call: the field of `timeline.Derived` holding it.
    per_call: str = ""

    @property
    def scale(self) -> int:
        """Recorded integers per unit: 1,000,000 µs a second, 1 token a token."""
        return US_PER_SECOND if self.unit == "seconds" else 1

    def to_unit(self, value: int) -> float:
        """A recorded integer in the family's unit (seconds, tokens or a count)."""
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
    "Time from the SDK call to the first output token of any kind.", True, windowed=True,
    per_call="ttft")
FIRST_ANSWER = Family(
    "llm_client_time_to_first_answer_token_seconds", "seconds",
    "Time from the SDK call to the first output token that is not reasoning.", True,
    windowed=True, per_call="first_answer")
ITL = Family(
    "llm_client_inter_token_latency_seconds", "seconds",
    "Each gap between consecutive token events after the first.", False)
TPOT = Family(
    "llm_client_time_per_output_token_seconds", "seconds",
    "Per call: (last token - first token) / (output tokens - 1).", False, per_call="tpot")
STALL = Family(
    "llm_client_stream_stall_seconds", "seconds",
    "Per call: the largest gap between consecutive token events.", True, windowed=True,
    per_call="stall")
DURATION = Family(
    "llm_client_request_duration_seconds", "seconds",
    "Time from the SDK call to the end of the response.", True, windowed=True,
    per_call="duration")
PHASE_FAMILY = Family(
    "llm_client_phase_seconds", "seconds",
    "Time spent in each phase of the call (retry, queue, connect, send, server, prefill, "
    "reasoning, decode).", False, extra_label=PHASE)
SERVER_QUEUE = Family(
    "llm_client_server_queue_seconds", "seconds",
    "Per call whose server reported it (vLLM's per-request metrics): the time the request "
    "waited in the server's queue before it was scheduled.", False, per_call="server_queue")
SERVER_PREFILL = Family(
    "llm_client_server_prefill_seconds", "seconds",
    "Per call whose server reported it: the server's own time to its first token, from "
    "scheduling the request (vLLM) or from starting on the prompt (llama.cpp).", False,
    per_call="server_prefill")
OUTSIDE_SERVER = Family(
    "llm_client_time_to_first_token_outside_server_seconds", "seconds",
    "Per streamed call whose server reported its prefill: time to first token - (server "
    "queue + server prefill): the client's queue, the network, gateways and the server's "
    "HTTP layer.", False, per_call="outside_server")
INPUT_TOKENS = Family(
    "llm_client_input_tokens", "tokens", "Input tokens per call, from the provider's usage.", False,
    per_call="input_tokens")
OUTPUT_TOKENS = Family(
    "llm_client_output_tokens", "tokens", "Output tokens per call, from the provider's usage.",
    False, per_call="output_tokens")
CACHED_INPUT_TOKENS = Family(
    "llm_client_cached_input_tokens", "tokens",
    "Input tokens per call served from the provider's prompt cache.", False,
    per_call="cached_input_tokens")
REQUESTED_MAX_TOKENS = Family(
    "llm_client_requested_max_tokens", "tokens",
    "max_tokens (or max_completion_tokens, max_output_tokens) of each call that set it.", False,
    per_call="max_tokens")
MAX_TOKENS_HEADROOM = Family(
    "llm_client_max_tokens_headroom", "tokens",
    "Per call that set max_tokens and reported usage: max_tokens - output tokens.", False,
    per_call="max_tokens_headroom")
TASK_DURATION = Family(
    "llm_client_task_duration_seconds", "seconds",
    "Time from the start of an agent task to its end.", False, base=(TASK,))
TASK_STEPS = Family(
    "llm_client_task_steps", "count", "LLM calls (steps) per agent task.", False, base=(TASK,))
TASK_TIME = Family(
    "llm_client_task_time_seconds", "seconds",
    "Per agent task, the time of each kind: queue, network and provider time of its LLM calls, "
    "tool and guardrail time, and app (covered by none of them).", False, extra_label=KIND,
    base=(TASK,))
TASK_CRITICAL_PATH = Family(
    "llm_client_task_critical_path_seconds", "seconds",
    "Per agent task: the time its calls, tools and guardrails covered, less what running each "
    "run of sequential tools in parallel would save.", False, base=(TASK,))

HISTOGRAMS: tuple[Family, ...] = (
    TTFT, FIRST_ANSWER, ITL, TPOT, STALL, DURATION, PHASE_FAMILY,
    SERVER_QUEUE, SERVER_PREFILL, OUTSIDE_SERVER, INPUT_TOKENS, OUTPUT_TOKENS, CACHED_INPUT_TOKENS, REQUESTED_MAX_TOKENS, MAX_TOKENS_HEADROOM,
    TASK_DURATION, TASK_STEPS, TASK_TIME, TASK_CRITICAL_PATH,
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
UPSTREAM_LABELS: tuple[str, ...] = (ADDRESS, FINGERPRINT, MODEL, PROVIDER, REGION, ROUTE)
#: Response headers naming the region that answered (the first one present wins).
REGION_HEADERS: tuple[str, ...] = ("x-ms-region", "x-region")

# --- self-metrics --------------------------------------------------------------------------------
SELF_SERIES = "ttft_exporter_series"
SELF_TENANT_FOLDS = "ttft_exporter_tenant_folds_total"
SELF_LABEL_FOLDS = "ttft_exporter_label_folds_total"  # {label}
SELF_DROPS = "ttft_exporter_dropped_total"  # {reason}
SELF_SCRAPE_DURATION = "ttft_exporter_scrape_duration_seconds"
#: `ttft-exporter watch` (diagnose/watch.py): 1 per degraded (model, route, cause[, tenant]),
#: what the LLMTTFTLikelyCause alert selects; and the watch's own health.
LIKELY_CAUSE = "llm_ttft_likely_cause"
WATCH_EVALUATIONS = "ttft_exporter_watch_evaluations_total"  # {outcome}: ok, error
WATCH_SECONDS = "ttft_exporter_watch_evaluation_seconds"
WATCH_LAST_SUCCESS = "ttft_exporter_watch_last_success_timestamp_seconds"
#: {reason}: limit, slow, shed, unread, large (expose/connection_guard.py)
SELF_HTTP_CLOSED = "ttft_exporter_http_connections_closed_total"

# Reasons for a counted drop (label ``reason`` of SELF_DROPS).
DROP_SERIES_LIMIT = "series_limit"
DROP_BAD_VALUE = "bad_value"
DROP_BAD_LABEL = "bad_label"
DROP_INTERNAL = "internal_error"
#: A task past shim/task.MAX_RECORDS steps and blocks (one left unfinished collects forever).
DROP_TASK_OVERFLOW = "task_overflow"
DROP_REASONS: tuple[str, ...] = (DROP_SERIES_LIMIT, DROP_BAD_VALUE, DROP_BAD_LABEL, DROP_INTERNAL,
                                 DROP_TASK_OVERFLOW)

#: Labels whose values are a closed set: a push carrying another value is malformed.
CLOSED_LABELS: dict[str, tuple[str, ...]] = {
    PHASE: PHASES, KIND: TASK_KINDS, DEADLINE: DEADLINE_OUTCOMES, OUTCOME: OUTCOMES,
    FINISH_REASON: FINISH_REASONS}


# --- the counter families: one table ------------------------------------------------------------
@dataclass(frozen=True)
class Counter:
    """A counter (or gauge) family recorded as rows: label values -> count.

    This table is the only place a counter is declared: the recorder keeps a dict of rows per
    entry, a push worker takes them, the wire format carries them, the aggregator merges and
    snapshots them and every exposition serves them, all by iterating `COUNTERS`. Adding a
    counter is one entry here (its rows then travel in the push payload's `counters` object)
    and its docs. Rows are bounded by labels.max_series: past it a new row folds into its
    overflow row (`__other__` for every label but the closed ones).
    """

    name: str  # with the `_total` suffix for a counter
    help: str
    labels: tuple[str, ...]  # sorted (the order Prometheus text uses)
    #: A gauge (the calls in flight): each worker pushes its current value, the aggregator
    #: serves the sum over its live workers.
    gauge: bool = False
    #: The labels whose folds this counter's rows count: a call's labels fold once, counted on
    #: the requests rows, a task's on the tasks rows, an upstream identity on the upstream
    #: rows (`address` stands for the identity); the other counters carry the labels already
    #: folded and count nothing. A row past labels.max_series counts as a fold of its whole
    #: label set (`series`) on these counters only.
    counts_folds: tuple[str, ...] = ()
    #: Closed values of the one label, each served (at zero) before it is first counted.
    zero_rows: tuple[str, ...] = ()
    #: The push payload's key for the counters of the wire format's first release (version 1);
    #: "" for those added since, which travel in its `counters` object.
    wire: str = ""
    own_values: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (label, values) closed here alone

    @property
    def closed(self) -> tuple[tuple[int, tuple[str, ...]], ...]:
        """(position, allowed values) of the labels whose values are a closed set."""
        if self.zero_rows:
            return ((0, self.zero_rows),)
        allowed = {**CLOSED_LABELS, **dict(self.own_values)}
        return tuple((i, allowed[name]) for i, name in enumerate(self.labels) if name in allowed)

    def overflow(self, row: tuple[str, ...]) -> tuple[str, ...]:
        """The row `row` folds into past labels.max_series: closed labels keep their value."""
        kept = {i for i, _ in self.closed}
        return tuple(v if i in kept else OTHER_TENANT for i, v in enumerate(row))


REQUESTS = Counter(
    REQUESTS_TOTAL, "LLM calls by outcome (ok, client_error, rate_limited, provider_error, "
    "timeout, connection_error, error, cancelled, abandoned).",
    (MODEL, OUTCOME, PROVIDER, ROUTE, TENANT), counts_folds=(MODEL, PROVIDER, ROUTE, TENANT),
    wire="requests")
IN_FLIGHT = Counter(
    REQUESTS_IN_FLIGHT, "LLM calls started and not yet ended.", (MODEL, PROVIDER, ROUTE),
    gauge=True, wire="in_flight")
USAGE_INPUT = Counter(
    USAGE_INPUT_TOKENS, "Input tokens of the calls, from the provider's usage.", USAGE_LABELS,
    wire="input_tokens")
USAGE_CACHED = Counter(
    USAGE_CACHED_INPUT_TOKENS, "Input tokens the provider served from its prompt cache.",
    USAGE_LABELS, wire="cached_tokens")
UPSTREAMS = Counter(
    UPSTREAM_REQUESTS, "LLM calls by the upstream that answered: resolved address, region "
    "header, system fingerprint (unknown where not seen).", UPSTREAM_LABELS,
    counts_folds=(ADDRESS,), wire="upstreams")
FINISH_REASONS_TOTAL = Counter(
    "llm_client_finish_reasons_total", "LLM calls by the reason the provider stopped "
    "generating (stop, length, tool_calls, content_filter, other).",
    (FINISH_REASON, MODEL, PROVIDER, ROUTE))
RETRIES = Counter(
    "llm_client_retries_total", "Attempts of LLM calls that failed and were retried by the "
    "client, by what ended them (rate_limited, overloaded, server_error, timeout, connection, "
    "other).", (MODEL, PROVIDER, REASON, ROUTE), own_values=((REASON, RETRY_REASONS),))
TASKS_TOTAL = Counter(
    "llm_client_tasks_total", "Agent tasks by outcome and deadline (none, met, exceeded).",
    (DEADLINE, OUTCOME, TASK), counts_folds=(TASK,))
TASK_LATE_CALLS = Counter(
    "llm_client_task_late_calls_total",
    "LLM calls started after their task's deadline had passed.", (TASK,))
TASK_ORPHAN_TOKENS = Counter(
    "llm_client_task_orphan_tokens_total",
    "Output tokens generated after their task's deadline (work nobody waits for).", (TASK,))
TASK_WATERFALL_CALLS = Counter(
    "llm_client_task_waterfall_tool_calls_total",
    "Tool calls that started after another tool of their task ended, with no LLM call in "
    "between (waterfall candidates).", (TASK,))
TENANT_FOLDS = Counter(
    SELF_TENANT_FOLDS, "Calls whose tenant was folded into __other__ by the label guard.",
    (MODEL, ROUTE), wire="tenant_folds")
FOLDS_BY_LABEL = Counter(
    SELF_LABEL_FOLDS, "Calls whose model, route or provider, tasks whose name (or, when a "
    "family reached max_series rows, whole label set) was folded into __other__.", (LABEL,),
    zero_rows=LABEL_FOLDS, wire="label_folds")
DROPPED = Counter(
    SELF_DROPS, "Values or series not recorded, by reason.", (REASON,), zero_rows=DROP_REASONS,
    wire="dropped")
#: Every counter family, in exposition order.
COUNTERS: tuple[Counter, ...] = (
    REQUESTS, IN_FLIGHT, USAGE_INPUT, USAGE_CACHED, UPSTREAMS, FINISH_REASONS_TOTAL, RETRIES,
    TASKS_TOTAL, TASK_LATE_CALLS, TASK_ORPHAN_TOKENS, TASK_WATERFALL_CALLS, TENANT_FOLDS,
    FOLDS_BY_LABEL, DROPPED)
COUNTERS_BY_NAME: dict[str, Counter] = {c.name: c for c in COUNTERS}

# Aggregator self-metrics (`ttft-exporter serve` receiving pushes from worker processes).
SELF_PUSH_REJECTED = "ttft_exporter_push_rejected_total"  # {reason}
SELF_PUSH_BATCHES = "ttft_exporter_push_batches_total"  # {result}
SELF_PUSH_WORKERS = "ttft_exporter_push_workers"
SELF_PUSH_LOST = "ttft_exporter_push_lost_batches_total"
SELF_PUSH_FAILURES = "ttft_exporter_push_failures_total"
SELF_SNAPSHOT_FAILURES = "ttft_exporter_snapshot_failures_total"
RESULT = "result"
# Reasons a push is rejected (label ``reason`` of SELF_PUSH_REJECTED), and results of the others.
REJECT_UNAUTHORIZED = "unauthorized"
REJECT_TOO_LARGE = "too_large"
REJECT_MALFORMED = "malformed"
REJECT_INCOMPATIBLE = "incompatible"
REJECT_EVICTED = "evicted"  # a retry from a worker whose applied seqs were evicted
REJECT_REASONS: tuple[str, ...] = (REJECT_UNAUTHORIZED, REJECT_TOO_LARGE, REJECT_MALFORMED,
                                   REJECT_INCOMPATIBLE, REJECT_EVICTED)
PUSH_APPLIED = "applied"
PUSH_DUPLICATE = "duplicate"
PUSH_RESULTS: tuple[str, ...] = (PUSH_APPLIED, PUSH_DUPLICATE)

# --- OpenTelemetry GenAI names (docs/tracing.md: which text of the conventions) --------------
OTEL_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
OTEL_TIME_PER_OUTPUT_CHUNK = "gen_ai.client.operation.time_per_output_chunk"
OTEL_OPERATION_DURATION = "gen_ai.client.operation.duration"
#: Input and output tokens per operation, told apart by `gen_ai.token.type`.
OTEL_TOKEN_USAGE = "gen_ai.client.token.usage"
#: The token metrics this project emitted before (a proposal of the conventions that was not
#: merged): served beside the current ones only on opt-in (OTEL_SEMCONV_STABILITY_OPT_IN
#: `gen_ai/dup`, shim/otel.py). Counters, then the per-operation histograms.
LEGACY_USAGE_INPUT_TOKENS = "gen_ai.client.inference.usage.input_tokens"
LEGACY_USAGE_OUTPUT_TOKENS = "gen_ai.client.inference.usage.output_tokens"
LEGACY_USAGE_CACHE_READ_TOKENS = "gen_ai.client.inference.usage.cache_read.input_tokens"
LEGACY_USAGE_REASONING_TOKENS = "gen_ai.client.inference.usage.reasoning.output_tokens"
LEGACY_OPERATION_INPUT_TOKENS = "gen_ai.client.inference.operation.input_tokens"
LEGACY_OPERATION_OUTPUT_TOKENS = "gen_ai.client.inference.operation.output_tokens"

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
ATTR_CACHE_WRITE_TOKENS = "gen_ai.usage.cache_write.input_tokens"
ATTR_REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
ATTR_TOKEN_TYPE = "gen_ai.token.type"  # of OTEL_TOKEN_USAGE: TOKEN_INPUT or TOKEN_OUTPUT
TOKEN_INPUT = "input"
TOKEN_OUTPUT = "output"
#: Earlier names, set beside the current ones only on opt-in (`gen_ai/dup`): the cache write's
#: name before the conventions renamed it, the modality of the legacy token counters.
LEGACY_ATTR_CACHE_CREATION_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
LEGACY_ATTR_TOKEN_MODALITY = "gen_ai.token.modality"
ATTR_SERVER_ADDRESS = "server.address"
ATTR_SERVER_PORT = "server.port"
ATTR_ERROR_TYPE = "error.type"
ATTR_RESEND_COUNT = "http.request.resend_count"  # retries (OTel HTTP's; GenAI has none)
ATTR_ROUTE = "ttft_exporter.route"
ATTR_TENANT = "ttft_exporter.tenant"
ATTR_OUTCOME = "ttft_exporter.outcome"
ATTR_TIME_TO_FIRST_ANSWER = "ttft_exporter.time_to_first_answer_token"
ATTR_STALL = "ttft_exporter.stream_stall"
ATTR_PHASE_PREFIX = "ttft_exporter.phase."  # + phase name, seconds
# Agent tasks: one task span (the GenAI `invoke_agent` operation) parents its calls' spans,
# its tool spans (`execute_tool`) and its guardrail spans.
OP_INVOKE_AGENT = "invoke_agent"
OP_EXECUTE_TOOL = "execute_tool"
OP_GUARDRAIL = "guardrail"
ATTR_AGENT_NAME = "gen_ai.agent.name"
ATTR_TOOL_NAME = "gen_ai.tool.name"
ATTR_GUARDRAIL_NAME = "ttft_exporter.guardrail.name"
ATTR_TASK_PREFIX = "ttft_exporter.task."  # + steps, duration, time.<kind>, critical_path, ...

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
