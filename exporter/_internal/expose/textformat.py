"""The line syntax of the Prometheus text format (0.0.4) and OpenMetrics 1.0, as
prometheus_client writes it: label escaping and order, HELP/TYPE headers, numbers.

Both renderers (exposition.py, cached, and families.py, for small families) build on these, so
the bytes they serve are identical to prometheus_client's.
"""

from __future__ import annotations

from prometheus_client.utils import floatToGoString

#: The formats served (server.negotiate picks one per scrape).
PROTOBUF, OPENMETRICS, TEXT = "protobuf", "openmetrics", "text"
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
#: The protobuf exposition (protobuf_exposition.py): delimited MetricFamily messages.
PROTOBUF_PROTO = "io.prometheus.client.MetricFamily"
PROTOBUF_CONTENT_TYPE = (f"application/vnd.google.protobuf; proto={PROTOBUF_PROTO}; "
                         f"encoding=delimited")

number = floatToGoString


def count(n: int) -> str:
    """floatToGoString(float(n)) for a count, without the float round trip in the common case."""
    return f"{n}.0" if n < 1_000_000 else floatToGoString(n)


def escape(value: str) -> str:
    """A label value (or OpenMetrics HELP text) with backslash, newline and quote escaped."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def labels(pairs: list[tuple[str, str]]) -> str:
    """`k="v",...` sorted by label name, as prometheus_client orders them."""
    return ",".join(f'{k}="{escape(v)}"' for k, v in sorted(pairs))


def header(name: str, help_text: str, kind: str, openmetrics: bool) -> str:
    """The HELP and TYPE lines of a family (OpenMetrics names a counter without `_total`)."""
    if openmetrics:
        help_text = escape(help_text)
        if kind == "counter":
            name = name.removesuffix("_total")
    else:
        help_text = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"
