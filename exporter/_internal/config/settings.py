"""One YAML file drives the exporter, the label policy, the SLOs and every generated artefact.

The config's types: frozen dataclasses, every field with a default, so `Config()` is the
embedded default the demo and the generators use. Loading and validation (loader.py)
report every mistake at once with the file, line, key path and reason (`ConfigError`), never as
a traceback at record time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .. import names

#: Classic ``le`` layout in seconds: fine where SLOs live (10 ms to 120 s), then coarse up to
#: `histograms.max_seconds`, so a quantile above an SDK's timeout is a value, not the top bucket.
DEFAULT_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0,
    4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0, 1800.0,
    3600.0,
)
#: Classic ``le`` layout for token counts (input, output, cached input).
DEFAULT_TOKEN_BUCKETS: tuple[float, ...] = (
    16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576,
)
#: Classic ``le`` layout for small counts (steps per agent task): exact at every value to 6.
COUNT_BUCKETS: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 25, 32, 50, 64, 100,
                                  128, 256, 512, 1024)


class ConfigError(ValueError):
    """A user mistake in the configuration; `errors` lists (key path, reason) pairs, `lines`
    the line of a key path in the file, where the YAML parser knew it."""

    def __init__(self, source: str, errors: list[tuple[str, str]],
                 lines: Mapping[str, int] | None = None):
        self.source = source
        self.errors = errors
        self.lines = dict(lines or {})
        out = []
        for path, why in errors:
            line = self.lines.get(path)
            where = f"{source}:{line}" if line else source
            out.append(f"{where}: {path}: {why}" if path else f"{where}: {why}")
        super().__init__("\n".join(out))


class _Fields:
    """Equality, hash and repr over a config type's fields in their order: what
    `@dataclass(frozen=True)` generates, written once. dataclass compiles these from source for
    each class it makes, three of its six methods: 4 ms of the 14 this module took to import (a
    service's first call pays it; docs/performance.md, "Start-up")."""

    __slots__ = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__dataclass_fields__)  # type: ignore

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value
                           in zip(self.__dataclass_fields__, self._values()))  # type: ignore
        return f"{self.__class__.__qualname__}({fields})"


@dataclass(frozen=True, eq=False, repr=False)
class ServerConfig(_Fields):
    addr: str = "127.0.0.1"  # address /metrics (and /push) listen on
    port: int = 9469  # 0: any free port
    max_connections: int = 256  # past it an idle connection is shed (or the new one closed)
    max_connections_per_client: int = 64  # per client address; past it its oldest idle is shed
    header_timeout_seconds: float = 10.0  # for a complete request's headers (else closed)
    body_timeout_seconds: float = 30.0  # for a /push body (else 408)
    write_timeout_seconds: float = 30.0  # for a response's rest once it fills the send buffer
    max_unread_responses: int = 8  # at once (each holds its body); past it the oldest is shed
    reserved_connections: int = 8  # past max_connections, for /healthz and /push when all are busy


@dataclass(frozen=True, eq=False, repr=False)
class LabelConfig(_Fields):
    """Label guard: how tenant values are kept and how many series may exist."""

    tenant_policy: str = "raw"  # raw | hash | allowlist
    tenant_allowlist: tuple[str, ...] = ()  # tenant_policy allowlist: the tenants kept as is
    hash_salt: str = ""  # tenant_policy hash: salt of the tenant hash
    max_tenants: int = 100  # distinct tenants per (model, route); the rest fold into __other__
    max_series: int = 20000  # ceiling of every family's series (and of all tenant values)
    max_models: int = 100  # distinct models; the rest fold into __other__
    max_routes: int = 200  # distinct routes; the rest fold into __other__
    max_providers: int = 32  # distinct providers; the rest fold into __other__
    #: distinct upstreams (address, region, fingerprint) per model; the rest fold into __other__
    max_upstreams: int = 16
    max_tasks: int = 100  # distinct agent task names; the rest fold into __other__
    max_label_length: int = 128  # longer label values are cut to this length
    #: A capped value (model, route, provider, task, tenant, upstream) unseen for this long
    #: frees its slot and its series are dropped (a series that comes back starts from zero,
    #: which `rate()` reads as a counter reset); 0 keeps every value for good.
    expire_seconds: float = 3600.0
    #: Families that carry `tenant` besides the user-facing ones (names.Family.tenant_by_default).
    tenant_families: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False, repr=False)
class HistogramConfig(_Fields):
    significant_digits: int = 2  # HDR precision: 2 keeps every value within 1 %
    max_seconds: float = 3600.0  # largest duration recorded exactly (larger: clamped)
    max_tokens: int = 10_000_000  # largest token count recorded exactly (larger: clamped)
    #: Classic `le` bounds of the duration families (the SLO thresholds are added).
    seconds_buckets: tuple[float, ...] = DEFAULT_SECONDS_BUCKETS
    token_buckets: tuple[float, ...] = DEFAULT_TOKEN_BUCKETS  # classic `le` of the token families
    #: Schema of the native buckets served over protobuf (-4..8; 2^schema buckets per power
    #: of two). 5: buckets 2.2 % wide, quantiles within 3 % (docs/decisions.md, native.py).
    native_schema: int = 5
    #: A histogram with more populated native buckets is served at a coarser schema.
    native_max_buckets: int = 320
    #: Send the classic buckets in the protobuf format too (scrapers that ingest them: classic
    #: consumers of protobuf, `scrape_classic_histograms`). Off: only buckets carrying an
    #: exemplar (Prometheus 2.42 reads exemplars there), 37 % fewer bytes.
    protobuf_classic_buckets: bool = True


@dataclass(frozen=True, eq=False, repr=False)
class WindowConfig(_Fields):
    """Sliding window for the exact HDR quantiles: `slices` sub-windows of seconds/slices each."""

    seconds: float = 60.0  # length of the sliding window of the `_window` quantiles
    slices: int = 3  # sub-windows: the window moves by seconds / slices
    quantiles: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999)  # served by the `_window` families


@dataclass(frozen=True, eq=False, repr=False)
class Objective(_Fields):
    """`target` of the events must be at or under `threshold_seconds` (the error objective has
    none)."""

    #: Share of the calls that must meet the objective, over `alerting.slo_period_seconds`.
    target: float = 0.99
    #: The latency a call must be at or under to meet it (the error objective has none).
    threshold_seconds: float | None = None


@dataclass(frozen=True, eq=False, repr=False)
class SLO(_Fields):
    """Objectives for one (model, route) selector; empty selector values match everything."""

    model: str = ""  # the model this entry applies to (empty: every model)
    route: str = ""  # the route this entry applies to (empty: every route)
    ttft: Objective = Objective(0.99, 2.0)
    first_answer_token: Objective = Objective(0.99, 10.0)
    stall: Objective = Objective(0.99, 5.0)
    errors: Objective = Objective(0.99)


@dataclass(frozen=True, eq=False, repr=False)
class AlertingConfig(_Fields):
    """Knobs of the generated rules and dashboards (`ttft-exporter generate`) beyond the SLOs.

    Durations are nominal seconds. `window_scale` multiplies every rule window, offset and `for`
    duration, so a test config can run the 5m..3d logic in seconds; recording-rule names keep the
    nominal windows, so dashboards and alerts refer to the same names at any scale.
    """

    #: Base of every alert's `runbook_url` and of the panels' runbook links, absolute (an
    #: alert is read far from this repository); the section's anchor is appended.
    runbook_url: str = ("https://github.com/ttft-exporter/ttft-exporter/blob/main/docs/"
                        "runbooks.md")
    #: Prometheus `job` of the exporter's scrape target: a name, or a regular expression
    #: matching several. Every rule selects it; the exporter-down alerts watch it.
    exporter_job: str = "ttft-exporter"
    #: Extra PromQL matchers every rule selects, e.g. `namespace="prod"`.
    selector: str = ""
    #: Labels every SLI, recording and alert keeps besides model and route, so that two
    #: releases or services never record the same series.
    group_by: tuple[str, ...] = ("job",)
    #: `severity` label of the page and of the ticket alerts.
    page_severity: str = "critical"
    ticket_severity: str = "warning"  # `severity` of the ticket alerts
    #: SLO alerts stay quiet while a model and route made fewer calls than this over the
    #: alert's long window (a handful of calls cannot tell a burn rate).
    min_calls: int = 20
    #: The period an error budget is spent over (the budget panels, Sloth's period recordings).
    slo_period_seconds: float = 2592000.0
    #: `sloth_service` label of the Sloth-compatible recordings.
    service: str = "llm"
    window_scale: float = 1.0  # multiplies every rule window, offset and `for` (tests: < 1)
    #: "Same time last week": baseline of the TTFT p99 and connect-phase regression alerts.
    regression_offset_seconds: float = 604800.0
    regression_factor: float = 1.5  # p99 now / p99 at the offset that counts as a regression
    regression_min_seconds: float = 0.05  # and the p99 must have grown by at least this much
    #: Window of each tenant's TTFT p99 (a tenant needs calls in it to be compared).
    tenant_window_seconds: float = 300.0
    #: Baseline of the per-tenant comparison (noisy neighbour vs one tenant's own prompts/cache).
    tenant_baseline_offset_seconds: float = 3600.0
    tenant_degraded_factor: float = 1.5  # a tenant's p99 now / p99 at the baseline
    many_tenants_share: float = 0.5  # share of a (model, route)'s tenants degraded = "all tenants"
    many_tenants_min: int = 3  # fewer tenants compared than this never count as "many"
    top_tenants: int = 10  # N of the dashboards' top-N tenant panels
    dashboard_refresh: str = "30s"  # the dashboards' auto-refresh interval
    #: Share of a task's runs (with a deadline) that end past it before the overrun alert.
    task_deadline_overrun_share: float = 0.05
    #: Share of a model and route's calls stopped at max_tokens before the truncation alert.
    truncation_share: float = 0.02


@dataclass(frozen=True, eq=False, repr=False)
class DashboardsConfig(_Fields):
    """Which histograms the generated dashboards and rules read: `classic` (`le` buckets) or
    `native` (Prometheus native histograms, scraped over protobuf; docs/metrics.md)."""

    histograms: str = "classic"  # classic | native


@dataclass(frozen=True, eq=False, repr=False)
class PushConfig(_Fields):
    """Worker side of multi-process mode: how deltas reach `push_url` (`ttft-exporter serve`).

    Push is on when `push_url` (or the env var TTFT_EXPORTER_PUSH_URL) is set. The bearer token
    is read from `token_file`, else from the env var TTFT_EXPORTER_PUSH_TOKEN.
    """

    interval_seconds: float = 5.0  # how often a worker drains and pushes
    timeout_seconds: float = 5.0  # one HTTP attempt
    exit_timeout_seconds: float = 3.0  # at exit, retry the unacknowledged deltas this long
    #: Unacknowledged deltas kept (encoded bytes); past it the oldest is dropped and counted.
    max_pending_bytes: int = 16 * 2**20
    token_file: str = ""  # bearer token sent on /push (else env TTFT_EXPORTER_PUSH_TOKEN)
    ca_file: str = ""  # https push_url: trust this CA bundle (default: the system's)


@dataclass(frozen=True, eq=False, repr=False)
class AggregatorConfig(_Fields):
    """`ttft-exporter serve` as the aggregator: /push, snapshot, /metrics auth and TLS.

    /push requires `Authorization: Bearer <token>` when `push_token_file` (or the env var
    TTFT_EXPORTER_PUSH_TOKEN) gives a token. /metrics requires a bearer token
    (`metrics_token_file`) or basic auth (`metrics_username` + `metrics_password_file`) when set.
    """

    push_token_file: str = ""  # token /push requires (else env TTFT_EXPORTER_PUSH_TOKEN)
    #: Let `serve` listen beyond loopback with no push token: anyone who reaches the port can
    #: then push forged calls (fire or hide pages). Only on a network you trust.
    allow_unauthenticated_push: bool = False
    max_body_bytes: int = 4 * 2**20  # compressed /push body
    max_decompressed_bytes: int = 16 * 2**20  # inflated /push body
    #: A worker's gauges are dropped when it has not pushed for this long (0: 3 × its interval).
    gauge_ttl_seconds: float = 0.0
    max_workers: int = 10_000  # (worker id, last seq) entries kept for idempotent retries
    snapshot_path: str = ""  # empty: no snapshot (a restart starts counting from zero)
    snapshot_interval_seconds: float = 30.0  # snapshot period (and one at SIGTERM)
    #: What an acknowledged push survives: `process` (journalled to the kernel: any crash of
    #: the process) or `machine` (fsync'd before the answer: a power loss too; pushes waiting
    #: meanwhile share one fsync).
    durability: str = "process"
    metrics_token_file: str = ""  # bearer token /metrics requires
    metrics_username: str = ""  # basic auth /metrics requires (with metrics_password_file)
    metrics_password_file: str = ""
    tls_cert_file: str = ""  # serve HTTPS (with tls_key_file)
    tls_key_file: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class OtelConfig(_Fields):
    """OpenTelemetry: spans and GenAI metrics go through the app's own providers, if any."""

    #: One span per call when the app installed an SDK TracerProvider.
    traces: bool = True
    #: Send the span's context (`traceparent`) with the request so a provider's span can join.
    propagate: bool = True
    #: The GenAI client metrics through the app's MeterProvider (for OTLP pipelines).
    metrics: bool = False


@dataclass(frozen=True, eq=False, repr=False)
class Config(_Fields):
    server: ServerConfig = ServerConfig()
    labels: LabelConfig = LabelConfig()
    histograms: HistogramConfig = HistogramConfig()
    window: WindowConfig = WindowConfig()
    #: First entry is the default; later entries override it for matching (model, route).
    slos: tuple[SLO, ...] = (SLO(),)
    #: Worker side of multi-process mode: the aggregator's base URL (env TTFT_EXPORTER_PUSH_URL
    #: wins); push is on when set.
    push_url: str = ""
    alerting: AlertingConfig = AlertingConfig()
    dashboards: DashboardsConfig = DashboardsConfig()
    push: PushConfig = PushConfig()
    aggregator: AggregatorConfig = AggregatorConfig()
    otel: OtelConfig = OtelConfig()

    def slo_thresholds(self) -> tuple[float, ...]:
        """Every SLO threshold in seconds: each must be a bucket boundary."""
        out = set()
        for slo in self.slos:
            for objective in (slo.ttft, slo.first_answer_token, slo.stall):
                if objective.threshold_seconds is not None:
                    out.add(objective.threshold_seconds)
        return tuple(sorted(out))

    def objective_thresholds(self, objective: str) -> tuple[float, ...]:
        """Thresholds in seconds of one latency objective (`ttft`, `first_answer_token`,
        `stall`) over every SLO entry, ascending."""
        found = {getattr(slo, objective).threshold_seconds for slo in self.slos}
        return tuple(sorted(t for t in found if t is not None))

    def seconds_buckets(self) -> tuple[float, ...]:
        """The classic `le` layout actually served: configured buckets up to `max_seconds`
        (the default layout reaches 3600 s) plus every SLO threshold."""
        top = self.histograms.max_seconds
        kept = {b for b in self.histograms.seconds_buckets if b <= top}
        return tuple(sorted(kept | set(self.slo_thresholds())))

    def family_has_tenant(self, family: names.Family) -> bool:
        if names.MODEL not in family.base:  # agent-task families: per task only
            return False
        return family.tenant_by_default or family.name in self.labels.tenant_families


def slo_for(config: Config, model: str, route: str) -> SLO:
    """The objectives that apply to (model, route): the last matching entry wins."""
    chosen = config.slos[0]
    for slo in config.slos[1:]:
        if slo.model in ("", model) and slo.route in ("", route):
            chosen = slo
    return chosen
