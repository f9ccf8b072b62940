"""Loading the config: a YAML file (or a dict) into a validated `Config`, every mistake at once.

One pass reports everything: type mistakes and cross-field ones, each with the key path, the
file and the line where the YAML parser saw the key, and a reason. An error names only keys the
user wrote: a check between two fields blames the one that was written, an override is never
blamed for what it inherited, and a check that involves a value already rejected for its type
is skipped (its default stands in and would only mislead). Whatever the bytes (not UTF-8, not
YAML, aliases expanding to millions of values), the result is a `ConfigError`, never a
traceback, and no message repeats more than a short excerpt of a value.

The checks are written out here rather than declared in a schema library: the dependencies are
fixed (PyYAML, no pydantic or jsonschema at run time), and neither would report the YAML line or
know which keys the user wrote.
"""

from __future__ import annotations

import math
import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from .bounds import BOUNDS, OBJECTIVES
from .settings import (SLO, AggregatorConfig, AlertingConfig, Config, ConfigError, DashboardsConfig,
                       HistogramConfig, LabelConfig, Objective, OtelConfig, PushConfig,
                       ServerConfig, WindowConfig)

_SECTIONS: dict[str, type] = {
    "server": ServerConfig, "labels": LabelConfig, "histograms": HistogramConfig,
    "window": WindowConfig, "alerting": AlertingConfig, "dashboards": DashboardsConfig,
    "push": PushConfig, "aggregator": AggregatorConfig, "otel": OtelConfig,
}
#: More values than this in a config (after YAML aliases are expanded) is not a config.
MAX_VALUES = 20_000
_INVALID = object()


def load(source: str | os.PathLike[str] | Mapping[str, Any] | None) -> Config:
    """Load and validate a config from a YAML path, a dict, or None (the defaults)."""
    if source is None:
        return Config()
    if isinstance(source, Mapping):
        return _build(dict(source), "<dict>", {})
    path = str(source)
    data, lines = _read_yaml(path)
    return _build(data, path, lines)


def key_lines(path: str | os.PathLike[str]) -> dict[str, int]:
    """The line of each key path written in the YAML file at `path` (for messages about a
    config loaded from it)."""
    return _read_yaml(str(path))[1]


def _read_yaml(path: str) -> tuple[Any, dict[str, int]]:
    """The document and, per key path, the line it is written on."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(path, [("", f"cannot read the file: {e.strerror or e}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(path, [("", f"not UTF-8 text (byte {raw[e.start]:#04x} at offset "
                                      f"{e.start})")]) from None
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            lines: dict[str, int] = {}
            if node is not None:
                _walk(node, "", lines, [0])
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(path, [("", f"not valid YAML: {where}{problem}")]) from None
    except (RecursionError, ValueError, TypeError) as e:
        raise ConfigError(path, [("", f"not a usable YAML document: {_short(e)}")]) from None
    return data if data is not None else {}, lines


def _walk(node: yaml.Node, path: str, lines: dict[str, int], count: list[int]) -> None:
    """Record the line of every key path; refuse documents that expand past MAX_VALUES."""
    count[0] += 1
    if count[0] > MAX_VALUES:
        raise ValueError(f"more than {MAX_VALUES} values (YAML aliases expanding?)")
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else "?"
            sub = f"{path}.{name}" if path else str(name)
            lines.setdefault(sub, key.start_mark.line + 1)
            _walk(value, sub, lines, count)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            sub = f"{path}[{i}]"
            lines.setdefault(sub, item.start_mark.line + 1)
            _walk(item, sub, lines, count)


class _Report:
    """The errors found so far, the key paths the user wrote, those rejected for their type."""

    def __init__(self, data: Any):
        self.errors: list[tuple[str, str]] = []
        self.written: set[str] = set()
        self.rejected: set[str] = set()
        _written(data, "", self.written)

    def type_error(self, path: str, why: str) -> None:
        self.errors.append((path, why))
        self.rejected.add(path)

    def check(self, bad: bool, path: str, why: str, involves: tuple[str, ...] = ()) -> None:
        """Report `why` at `path` when `bad`, unless a value it involves was rejected."""
        if bad and not any(_under(p, self.rejected) for p in (path, *involves)):
            self.errors.append((path, why))

    def blame(self, first: str, second: str) -> str:
        """Of two keys in conflict, the one the user wrote (the first when both or neither)."""
        return second if second in self.written and first not in self.written else first


def _written(data: Any, path: str, out: set[str]) -> None:
    if isinstance(data, Mapping):
        for key, value in data.items():
            sub = f"{path}.{key}" if path else str(key)
            out.add(sub)
            _written(value, sub, out)
    elif isinstance(data, list):
        for i, item in enumerate(data):
            sub = f"{path}[{i}]"
            out.add(sub)
            _written(item, sub, out)


def _under(path: str, paths: set[str]) -> bool:
    return any(path == p or path.startswith(p + ".") or path.startswith(p + "[") for p in paths)


def _build(data: Any, source: str, lines: dict[str, int]) -> Config:
    if not isinstance(data, Mapping):
        raise ConfigError(source, [("", f"expected a mapping at the top, got {_kind(data)}")])
    report = _Report(data)
    kwargs: dict[str, Any] = {}
    known = {f.name for f in fields(Config)}
    for key, value in data.items():
        if key not in known:
            report.type_error(str(key), f"unknown key (known: {', '.join(sorted(known))})")
        elif key in _SECTIONS:
            kwargs[key] = _section(_SECTIONS[key], value, key, report)
        elif key == "slos":
            kwargs[key] = _slos(value, report)
        elif key == "push_url":
            if isinstance(value, str):
                kwargs[key] = value
            else:
                report.type_error(key, f"expected a string, got {_kind(value)}")
    config = Config(**kwargs)
    _check(config, report)
    if report.errors:  # in the file's order where lines are known
        errors = sorted(report.errors, key=lambda error: lines.get(error[0], 1 << 30))
        raise ConfigError(source, errors, lines)
    return config


def _section(cls: type, value: Any, path: str, report: _Report, defaults: Any = None) -> Any:
    """Build dataclass `cls` from a mapping; keys not given keep their value in `defaults`."""
    if defaults is None:
        defaults = cls()
    if not isinstance(value, Mapping):
        report.type_error(path, f"expected a mapping, got {_kind(value)}")
        return defaults
    kwargs = {}
    by_name = {f.name for f in fields(cls)}
    for key, raw in value.items():
        sub = f"{path}.{key}"
        if key not in by_name:
            report.type_error(sub, f"unknown key (known: {', '.join(sorted(by_name))})")
            continue
        converted = _coerce(getattr(defaults, key), raw, sub, report)
        if converted is not _INVALID:
            kwargs[key] = converted
    return replace(defaults, **kwargs)


def _coerce(default: Any, raw: Any, path: str, report: _Report) -> Any:
    """Convert `raw` to the type of `default`, reporting a mistake instead of raising."""
    if default is None:  # optional number
        return _coerce(0.0, raw, path, report) if raw is not None else None
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
            items = [_coerce(element, item, f"{path}[{i}]", report) for i, item in enumerate(raw)]
            return _INVALID if _INVALID in items else tuple(items)
    expected = type(default).__name__ if not isinstance(default, tuple) else "list"
    report.type_error(path, f"expected {expected}, got {_kind(raw)} {_short(raw)}")
    return _INVALID


def _slos(value: Any, report: _Report) -> tuple[SLO, ...]:
    if not isinstance(value, list) or not value:
        report.type_error("slos", f"expected a non-empty list of objectives, got {_kind(value)}")
        return (SLO(),)
    out: list[SLO] = []
    selectors: dict[tuple[str, str], int] = {}
    for i, raw in enumerate(value):
        # Entries after the first override the first (the default) only where they say so.
        base = out[0] if out else SLO()
        path = f"slos[{i}]"
        if not isinstance(raw, Mapping):
            report.type_error(path, f"expected a mapping, got {_kind(raw)}")
            continue
        kwargs: dict[str, Any] = {}
        for key, item in raw.items():
            sub = f"{path}.{key}"
            if key in ("model", "route"):
                if isinstance(item, str):
                    kwargs[key] = item
                else:
                    report.type_error(sub, f"expected a string, got {_kind(item)}")
            elif key in OBJECTIVES:
                if isinstance(item, Mapping):
                    kwargs[key] = _section(Objective, item, sub, report, getattr(base, key))
                else:
                    report.type_error(sub, f"expected a mapping with target and "
                                           f"threshold_seconds, got {_kind(item)}")
            else:
                report.type_error(sub, f"unknown key (known: {', '.join(sorted(OBJECTIVES))}, "
                                       f"model, route)")
        slo = replace(base, **{"model": "", "route": "", **kwargs})
        if i:
            selector = (slo.model, slo.route)
            report.check(selector in selectors, path,
                         f"the same model and route as slos[{selectors.get(selector)}]: merge "
                         f"the two entries")
            selectors.setdefault(selector, i)
        out.append(slo)
    return tuple(out)


def _check(config: Config, e: _Report) -> None:
    """Every value against its bound (bounds.py), then the checks between values."""
    for path, bound in BOUNDS.items():
        if not path.startswith("slos"):
            for at, value in _values(config, path):
                e.check(not bound.accepts(value), at, f"{bound.reason()}, got {_short(value)}")
    hist = config.histograms
    for key in ("seconds_buckets", "token_buckets"):
        bounds = getattr(hist, key)
        e.check(list(bounds) != sorted(set(bounds)), f"histograms.{key}",
                "must be strictly increasing")
    # The default layout reaches 3600 s; with a smaller max_seconds it is cut there
    # (Config.seconds_buckets), so only buckets the user wrote can exceed it.
    if hist.seconds_buckets and hist.seconds_buckets[-1] > hist.max_seconds and \
            "histograms.seconds_buckets" in e.written:
        at = e.blame("histograms.seconds_buckets", "histograms.max_seconds")
        e.check(True, at, f"the largest bucket ({hist.seconds_buckets[-1]:g} s) exceeds "
                          f"histograms.max_seconds ({hist.max_seconds:g} s)",
                ("histograms.seconds_buckets", "histograms.max_seconds"))
    _check_slos(config, e)
    agg = config.aggregator
    e.check(agg.max_decompressed_bytes < agg.max_body_bytes,
            e.blame("aggregator.max_decompressed_bytes", "aggregator.max_body_bytes"),
            "aggregator.max_decompressed_bytes must be at least aggregator.max_body_bytes",
            ("aggregator.max_decompressed_bytes", "aggregator.max_body_bytes"))
    for one, other, what in (("tls_cert_file", "tls_key_file", "TLS"),
                             ("tls_key_file", "tls_cert_file", "TLS"),
                             ("metrics_username", "metrics_password_file", "basic auth"),
                             ("metrics_password_file", "metrics_username", "basic auth")):
        e.check(bool(getattr(agg, one)) and not getattr(agg, other), f"aggregator.{one}",
                f"{what} needs aggregator.{other} too")


def _values(config: Config, path: str) -> list[tuple[str, Any]]:
    """(key path, value) of a bound's path: one value, or each item of a list (`[]`)."""
    value: Any = config
    for name in path.removesuffix("[]").split("."):
        value = getattr(value, name)
    if path.endswith("[]"):
        return [(f"{path[:-2]}[{i}]", item) for i, item in enumerate(value)]
    return [(path, value)]


def _check_slos(config: Config, e: _Report) -> None:
    """Objectives; an override is checked only where it says something of its own."""
    max_seconds = config.histograms.max_seconds
    for i, slo in enumerate(config.slos):
        for key in OBJECTIVES:
            objective: Objective = getattr(slo, key)
            path = f"slos[{i}].{key}"
            target, threshold = f"{path}.target", f"{path}.threshold_seconds"
            if i == 0 or target in e.written:
                bound = BOUNDS[f"slos[].{key}.target"]
                e.check(not bound.accepts(objective.target), target,
                        f"{bound.reason()}, got {objective.target:g}")
            t = objective.threshold_seconds
            if key == "errors":
                e.check(t is not None, threshold, "the error objective has none")
            elif i == 0 or threshold in e.written:
                if t is not None and 0 < t and t > max_seconds and \
                        threshold not in e.written:
                    threshold = "histograms.max_seconds"
                e.check(t is None or not 0 < t <= max_seconds, threshold,
                        f"a threshold must be positive and at most histograms.max_seconds "
                        f"({max_seconds:g} s), got {t}", ("histograms.max_seconds",))


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "nothing"}.get(
        type(value), type(value).__name__)


def _short(value: Any, limit: int = 60) -> str:
    """A value's repr, cut to `limit` characters (a message never repeats a huge value)."""
    try:
        text = repr(value)
    except Exception:
        return "<unprintable>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
