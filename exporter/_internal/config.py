"""One YAML file drives the exporter, the label policy, the SLOs and every generated artefact.

Loaded into frozen dataclasses and validated up front, so a user mistake is reported once with
the file, the key path and the reason (`ConfigError`), never as a traceback at record time.
Every field has a default: `Config()` is the embedded default the demo and the generators use.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from . import names

#: Classic ``le`` layout in seconds: fine where SLOs live (10 ms to 120 s).
DEFAULT_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0,
    4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
)
#: Classic ``le`` layout for token counts (input, output, cached input).
DEFAULT_TOKEN_BUCKETS: tuple[float, ...] = (
    16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576,
)


class ConfigError(ValueError):
    """A user mistake in the configuration; `errors` lists (key path, reason) pairs."""

    def __init__(self, source: str, errors: list[tuple[str, str]]):
        self.source = source
        self.errors = errors
        lines = [f"{source}: {path}: {why}" for path, why in errors]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class ServerConfig:
    addr: str = "127.0.0.1"
    port: int = 9469


@dataclass(frozen=True)
class LabelConfig:
    """Label guard: how tenant values are kept and how many series may exist."""

    tenant_policy: str = "raw"  # raw | hash | allowlist
    tenant_allowlist: tuple[str, ...] = ()
    hash_salt: str = ""
    max_tenants: int = 100  # distinct tenants per (model, route); the rest fold into __other__
    max_series: int = 20000  # global ceiling over all histogram series
    max_label_length: int = 128
    #: Families that carry ``tenant`` besides the user-facing ones (names.Family.tenant_by_default).
    tenant_families: tuple[str, ...] = ()


@dataclass(frozen=True)
class HistogramConfig:
    significant_digits: int = 2
    max_seconds: float = 3600.0
    max_tokens: int = 10_000_000
    seconds_buckets: tuple[float, ...] = DEFAULT_SECONDS_BUCKETS
    token_buckets: tuple[float, ...] = DEFAULT_TOKEN_BUCKETS
    #: Schema of the native buckets served over protobuf (-4..8; 2^schema buckets per power
    #: of two). 5: buckets 2.2 % wide, quantiles within 3 % (docs/decisions.md, native.py).
    native_schema: int = 5
    #: A histogram with more populated native buckets is served at a coarser schema.
    native_max_buckets: int = 320
    #: Send the classic buckets in the protobuf format too (scrapers that ingest them: classic
    #: consumers of protobuf, `scrape_classic_histograms`). Off: only buckets carrying an
    #: exemplar (Prometheus 2.42 reads exemplars there), 37 % fewer bytes.
    protobuf_classic_buckets: bool = True


@dataclass(frozen=True)
class WindowConfig:
    """Sliding window for the exact HDR quantiles: `slices` sub-windows of seconds/slices each."""

    seconds: float = 60.0
    slices: int = 3
    quantiles: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999)


@dataclass(frozen=True)
class Objective:
    """`target` of the events must be at or under `threshold_seconds` (error objective: no threshold)."""

    target: float = 0.99
    threshold_seconds: float | None = None


@dataclass(frozen=True)
class SLO:
    """Objectives for one (model, route) selector; empty selector values match everything."""

    model: str = ""
    route: str = ""
    ttft: Objective = Objective(0.99, 2.0)
    first_answer_token: Objective = Objective(0.99, 10.0)
    stall: Objective = Objective(0.99, 5.0)
    errors: Objective = Objective(0.99)


@dataclass(frozen=True)
class AlertingConfig:
    """Knobs of the generated rules and dashboards (`ttft-exporter generate`) beyond the SLOs.

    Durations are nominal seconds. `window_scale` multiplies every rule window, offset and `for`
    duration, so a test config can run the 5m..3d logic in seconds; recording-rule names keep the
    nominal windows, so dashboards and alerts refer to the same names at any scale.
    """

    #: Base of every alert's `runbook_url`; the alert's anchor is appended.
    runbook_url: str = "docs/runbooks.md"
    #: Prometheus `job` label of the exporter's scrape target (exporter-down alert, dashboards).
    exporter_job: str = "ttft-exporter"
    window_scale: float = 1.0
    #: "Same time last week": baseline of the TTFT p99 and connect-phase regression alerts.
    regression_offset_seconds: float = 604800.0
    regression_factor: float = 1.5  # p99 now / p99 at the offset that counts as a regression
    regression_min_seconds: float = 0.05  # and the p99 must have grown by at least this much
    #: Baseline of the per-tenant comparison (noisy neighbour vs one tenant's own prompts/cache).
    tenant_baseline_offset_seconds: float = 3600.0
    tenant_degraded_factor: float = 1.5  # a tenant's p99 now / p99 at the baseline
    many_tenants_share: float = 0.5  # share of a (model, route)'s tenants degraded = "all tenants"
    many_tenants_min: int = 3  # fewer tenants compared than this never count as "many"
    top_tenants: int = 10  # N of the dashboards' top-N tenant panels
    dashboard_refresh: str = "30s"


@dataclass(frozen=True)
class DashboardsConfig:
    """Which histograms the generated dashboards and rules read: `classic` (`le` buckets) or
    `native` (Prometheus native histograms, scraped over protobuf; docs/metrics.md)."""

    histograms: str = "classic"  # classic | native


@dataclass(frozen=True)
class PushConfig:
    """Worker side of multi-process mode: how deltas reach `push_url` (`ttft-exporter serve`).

    Push is on when `push_url` (or the env var TTFT_EXPORTER_PUSH_URL) is set. The bearer token
    is read from `token_file`, else from the env var TTFT_EXPORTER_PUSH_TOKEN.
    """

    interval_seconds: float = 5.0
    timeout_seconds: float = 5.0  # one HTTP attempt
    exit_timeout_seconds: float = 3.0  # at exit, retry the unacknowledged deltas this long
    #: Unacknowledged deltas kept (encoded bytes); past it the oldest is dropped and counted.
    max_pending_bytes: int = 16 * 2**20
    token_file: str = ""
    ca_file: str = ""  # https push_url: trust this CA bundle (default: the system's)


@dataclass(frozen=True)
class AggregatorConfig:
    """`ttft-exporter serve` as the aggregator: /push, snapshot, /metrics auth and TLS.

    /push requires `Authorization: Bearer <token>` when `push_token_file` (or the env var
    TTFT_EXPORTER_PUSH_TOKEN) gives a token. /metrics requires a bearer token
    (`metrics_token_file`) or basic auth (`metrics_username` + `metrics_password_file`) when set.
    """

    push_token_file: str = ""
    max_body_bytes: int = 8 * 2**20  # compressed /push body
    max_decompressed_bytes: int = 64 * 2**20
    #: A worker's gauges are dropped when it has not pushed for this long (0: 3 × its interval).
    gauge_ttl_seconds: float = 0.0
    max_workers: int = 10_000  # (worker id, last seq) entries kept for idempotent retries
    snapshot_path: str = ""  # empty: no snapshot (a restart starts counting from zero)
    snapshot_interval_seconds: float = 30.0
    metrics_token_file: str = ""
    metrics_username: str = ""
    metrics_password_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""


@dataclass(frozen=True)
class OtelConfig:
    """OpenTelemetry: spans and GenAI metrics go through the app's own providers, if any."""

    #: One span per call when the app installed an SDK TracerProvider.
    traces: bool = True
    #: Send the span's context (`traceparent`) with the request so a provider's span can join.
    propagate: bool = True
    #: The GenAI client metrics through the app's MeterProvider (for OTLP pipelines).
    metrics: bool = False


@dataclass(frozen=True)
class Config:
    server: ServerConfig = ServerConfig()
    labels: LabelConfig = LabelConfig()
    histograms: HistogramConfig = HistogramConfig()
    window: WindowConfig = WindowConfig()
    #: First entry is the default; later entries override it for matching (model, route).
    slos: tuple[SLO, ...] = (SLO(),)
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
        """The classic `le` layout actually served: configured buckets plus every SLO threshold."""
        return tuple(sorted(set(self.histograms.seconds_buckets) | set(self.slo_thresholds())))

    def family_has_tenant(self, family: names.Family) -> bool:
        return family.tenant_by_default or family.name in self.labels.tenant_families


# --- loading --------------------------------------------------------------------------------------

_SECTIONS: dict[str, type] = {
    "server": ServerConfig, "labels": LabelConfig, "histograms": HistogramConfig,
    "window": WindowConfig, "alerting": AlertingConfig, "dashboards": DashboardsConfig,
    "push": PushConfig,
    "aggregator": AggregatorConfig, "otel": OtelConfig,
}


def load(source: str | os.PathLike[str] | Mapping[str, Any] | None) -> Config:
    """Load and validate a config from a YAML path, a dict, or None (the defaults)."""
    if source is None:
        return Config()
    if isinstance(source, Mapping):
        return _build(dict(source), "<dict>")
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(str(path), [("", f"cannot read file: {e.strerror or e}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(str(path), [(where, f"not valid YAML: {getattr(e, 'problem', e)}")]) \
            from None
    if data is None:
        data = {}
    return _build(data, str(path))


def _build(data: Any, source: str) -> Config:
    errors: list[tuple[str, str]] = []
    if not isinstance(data, Mapping):
        raise ConfigError(source, [("", f"expected a mapping at the top, got {_kind(data)}")])
    kwargs: dict[str, Any] = {}
    known = {f.name for f in fields(Config)}
    for key, value in data.items():
        if key not in known:
            errors.append((str(key), f"unknown key (known: {', '.join(sorted(known))})"))
        elif key in _SECTIONS:
            kwargs[key] = _section(_SECTIONS[key], value, key, errors)
        elif key == "slos":
            kwargs[key] = _slos(value, errors)
        elif key == "push_url":
            if not isinstance(value, str):
                errors.append((key, f"expected a string, got {_kind(value)}"))
            else:
                kwargs[key] = value
    if errors:
        raise ConfigError(source, errors)
    config = Config(**kwargs)
    _check(config, errors)
    if errors:
        raise ConfigError(source, errors)
    return config


def _section(cls: type, value: Any, path: str, errors: list[tuple[str, str]],
             defaults: Any = None) -> Any:
    """Build dataclass `cls` from a mapping; keys not given keep their value in `defaults`."""
    if defaults is None:
        defaults = cls()
    if not isinstance(value, Mapping):
        errors.append((path, f"expected a mapping, got {_kind(value)}"))
        return defaults
    kwargs = {}
    by_name = {f.name: f for f in fields(cls)}
    for key, raw in value.items():
        sub = f"{path}.{key}"
        if key not in by_name:
            errors.append((sub, f"unknown key (known: {', '.join(sorted(by_name))})"))
            continue
        converted = _coerce(getattr(defaults, key), raw, sub, errors)
        if converted is not _INVALID:
            kwargs[key] = converted
    return replace(defaults, **kwargs)


_INVALID = object()


def _coerce(default: Any, raw: Any, path: str, errors: list[tuple[str, str]]) -> Any:
    """Convert `raw` to the type of `default`, recording an error instead of raising."""
    if default is None:  # optional number
        return _coerce(0.0, raw, path, errors) if raw is not None else None
    if isinstance(default, bool):
        if isinstance(raw, bool):
            return raw
    elif isinstance(default, int):
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
    elif isinstance(default, float):
        if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
            return float(raw)
    elif isinstance(default, str):
        if isinstance(raw, str):
            return raw
    elif isinstance(default, tuple):
        if isinstance(raw, list):
            element = default[0] if default else ""
            items = [_coerce(element, item, f"{path}[{i}]", errors) for i, item in enumerate(raw)]
            return _INVALID if _INVALID in items else tuple(items)
    expected = type(default).__name__ if not isinstance(default, tuple) else "list"
    errors.append((path, f"expected {expected}, got {_kind(raw)} {raw!r}"))
    return _INVALID


def _slos(value: Any, errors: list[tuple[str, str]]) -> tuple[SLO, ...]:
    if not isinstance(value, list) or not value:
        errors.append(("slos", f"expected a non-empty list of objectives, got {_kind(value)}"))
        return (SLO(),)
    out: list[SLO] = []
    for i, raw in enumerate(value):
        # Entries after the first override the first (the default) only where they say so.
        base = out[0] if out else SLO()
        path = f"slos[{i}]"
        if not isinstance(raw, Mapping):
            errors.append((path, f"expected a mapping, got {_kind(raw)}"))
            continue
        kwargs: dict[str, Any] = {}
        for key, item in raw.items():
            sub = f"{path}.{key}"
            if key in ("model", "route"):
                if isinstance(item, str):
                    kwargs[key] = item
                else:
                    errors.append((sub, f"expected a string, got {_kind(item)}"))
            elif key in ("ttft", "first_answer_token", "stall", "errors"):
                objective = _section(Objective, item, sub, errors, getattr(base, key)) \
                    if isinstance(item, Mapping) else _bad(errors, sub, item)
                if objective is not None:
                    kwargs[key] = objective
            else:
                errors.append((sub, "unknown key (known: errors, first_answer_token, model, "
                                    "route, stall, ttft)"))
        out.append(replace(base, **{"model": "", "route": "", **kwargs}))
    return tuple(out)


def _bad(errors: list[tuple[str, str]], path: str, value: Any) -> None:
    errors.append((path, f"expected a mapping with target and threshold_seconds, got "
                         f"{_kind(value)}"))
    return None


def _check(config: Config, errors: list[tuple[str, str]]) -> None:
    """Cross-field validation of an already typed config."""
    lab = config.labels
    if lab.tenant_policy not in ("raw", "hash", "allowlist"):
        errors.append(("labels.tenant_policy",
                       f"must be one of raw, hash, allowlist; got {lab.tenant_policy!r}"))
    if lab.max_tenants < 1:
        errors.append(("labels.max_tenants", "must be at least 1"))
    if lab.max_series < 1:
        errors.append(("labels.max_series", "must be at least 1"))
    if lab.max_label_length < 8:
        errors.append(("labels.max_label_length", "must be at least 8"))
    for i, name in enumerate(lab.tenant_families):
        if name not in names.HISTOGRAMS_BY_NAME:
            errors.append((f"labels.tenant_families[{i}]", f"not a histogram family: {name!r}"))
    hist = config.histograms
    if not 1 <= hist.significant_digits <= 3:
        errors.append(("histograms.significant_digits", "must be 1, 2 or 3"))
    if hist.max_seconds < 1:
        errors.append(("histograms.max_seconds", "must be at least 1"))
    if hist.max_tokens < 1000:
        errors.append(("histograms.max_tokens", "must be at least 1000"))
    if not -4 <= hist.native_schema <= 8:
        errors.append(("histograms.native_schema", f"must be between -4 and 8 (Prometheus' "
                       f"exponential schemas), got {hist.native_schema}"))
    if hist.native_max_buckets < 8:
        errors.append(("histograms.native_max_buckets", "must be at least 8"))
    for key in ("seconds_buckets", "token_buckets"):
        bounds = getattr(hist, key)
        if not bounds:
            errors.append((f"histograms.{key}", "must not be empty"))
        elif list(bounds) != sorted(set(bounds)) or bounds[0] <= 0:
            errors.append((f"histograms.{key}", "must be positive and strictly increasing"))
    if hist.seconds_buckets and hist.seconds_buckets[-1] > hist.max_seconds:
        errors.append(("histograms.seconds_buckets", "largest bucket exceeds max_seconds"))
    win = config.window
    if win.seconds <= 0:
        errors.append(("window.seconds", "must be positive"))
    if not 1 <= win.slices <= 60:
        errors.append(("window.slices", "must be between 1 and 60"))
    for i, q in enumerate(win.quantiles):
        if not 0 < q < 1:
            errors.append((f"window.quantiles[{i}]", f"must be strictly between 0 and 1, got {q}"))
    for i, slo in enumerate(config.slos):
        for key in ("ttft", "first_answer_token", "stall", "errors"):
            objective: Objective = getattr(slo, key)
            path = f"slos[{i}].{key}"
            if not 0 < objective.target < 1:
                errors.append((f"{path}.target", f"must be strictly between 0 and 1, got "
                                                 f"{objective.target}"))
            t = objective.threshold_seconds
            if key == "errors":
                if t is not None:
                    errors.append((f"{path}.threshold_seconds", "the error objective has none"))
            elif t is None or not 0 < t <= hist.max_seconds:
                errors.append((f"{path}.threshold_seconds",
                               f"must be positive and at most histograms.max_seconds, got {t}"))
    _check_alerting(config.alerting, errors)
    if config.dashboards.histograms not in ("classic", "native"):
        errors.append(("dashboards.histograms", f"must be classic or native, got "
                                                f"{config.dashboards.histograms!r}"))
    if config.push_url and not config.push_url.startswith(("http://", "https://")):
        errors.append(("push_url", "must be an http:// or https:// URL"))
    _check_push(config.push, config.aggregator, errors)


def _check_alerting(al: AlertingConfig, errors: list[tuple[str, str]]) -> None:
    for key in ("runbook_url", "exporter_job"):
        if not getattr(al, key):
            errors.append((f"alerting.{key}", "must not be empty"))
    for key in ("window_scale", "regression_offset_seconds", "tenant_baseline_offset_seconds"):
        if getattr(al, key) <= 0:
            errors.append((f"alerting.{key}", "must be positive"))
    if al.regression_min_seconds < 0:
        errors.append(("alerting.regression_min_seconds", "must not be negative"))
    for key in ("regression_factor", "tenant_degraded_factor"):
        if getattr(al, key) <= 1:
            errors.append((f"alerting.{key}", "must be greater than 1"))
    if not 0 < al.many_tenants_share <= 1:
        errors.append(("alerting.many_tenants_share", "must be in (0, 1]"))
    for key in ("many_tenants_min", "top_tenants"):
        if getattr(al, key) < 1:
            errors.append((f"alerting.{key}", "must be at least 1"))
    if not re.fullmatch(r"[1-9][0-9]*[smhd]", al.dashboard_refresh):
        errors.append(("alerting.dashboard_refresh", f"must be a Grafana interval such as 30s "
                                                     f"or 1m, got {al.dashboard_refresh!r}"))


def _check_push(push: PushConfig, agg: AggregatorConfig, errors: list[tuple[str, str]]) -> None:
    """Numbers of the push and aggregator sections; files are checked when serve starts."""
    for key in ("interval_seconds", "timeout_seconds"):
        if not 0 < getattr(push, key) <= 3600:
            errors.append((f"push.{key}", "must be positive and at most 3600"))
    if not 0 <= push.exit_timeout_seconds <= 60:
        errors.append(("push.exit_timeout_seconds", "must be between 0 and 60"))
    if push.max_pending_bytes < 2**16:
        errors.append(("push.max_pending_bytes", "must be at least 65536"))
    if agg.max_body_bytes < 2**10:
        errors.append(("aggregator.max_body_bytes", "must be at least 1024"))
    if agg.max_decompressed_bytes < agg.max_body_bytes:
        errors.append(("aggregator.max_decompressed_bytes", "must be at least max_body_bytes"))
    if agg.gauge_ttl_seconds < 0:
        errors.append(("aggregator.gauge_ttl_seconds", "must not be negative"))
    if agg.max_workers < 1:
        errors.append(("aggregator.max_workers", "must be at least 1"))
    if agg.snapshot_interval_seconds <= 0:
        errors.append(("aggregator.snapshot_interval_seconds", "must be positive"))
    if bool(agg.tls_cert_file) != bool(agg.tls_key_file):
        errors.append(("aggregator.tls_key_file" if agg.tls_cert_file else
                       "aggregator.tls_cert_file", "TLS needs both tls_cert_file and tls_key_file"))
    if bool(agg.metrics_username) != bool(agg.metrics_password_file):
        errors.append(("aggregator.metrics_password_file" if agg.metrics_username else
                       "aggregator.metrics_username",
                       "basic auth needs both metrics_username and metrics_password_file"))
    if ":" in agg.metrics_username:
        errors.append(("aggregator.metrics_username", "must not contain ':'"))


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "nothing"}.get(
        type(value), type(value).__name__)


def slo_for(config: Config, model: str, route: str) -> SLO:
    """The objectives that apply to (model, route): the last matching entry wins."""
    chosen = config.slos[0]
    for slo in config.slos[1:]:
        if slo.model in ("", model) and slo.route in ("", route):
            chosen = slo
    return chosen
