"""The served bytes equal prometheus_client's rendering of the same families, exactly (less
the OpenMetrics `_created` lines, which tests/test_exposition_golden.py and
test_every_counter_row_and_histogram_series_has_a_created_line pin)."""

import re
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import exporter
from exporter._internal import names, runtime
from exporter._internal.config.loader import load
from exporter._internal.expose.text import Renderer
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline
from tests.support.clock import ManualClock

MS = 1_000_000


def record(model="m", route="r", tenant="t", provider="p", ttft_ms=120, gaps_ms=(20, 30),
           outcome="ok", start=None, trace_id=None):
    if start is None:  # so that the call ends now, in the current window slice
        start = time.perf_counter_ns() - (ttft_ms + sum(gaps_ms) + 1) * MS
    t = CallTimeline(start=start, model=model, route=route, tenant=tenant, provider=provider)
    t.sent = start + MS
    t.headers = start + 50 * MS
    now = start + ttft_ms * MS
    t.token(now, "reasoning")
    for g in gaps_ms:
        now += g * MS
        t.token(now)
    t.end = now + MS
    t.input_tokens, t.output_tokens, t.cached_input_tokens = 1200, len(gaps_ms) + 1, 1024
    t.outcome = outcome
    t.trace_id = trace_id
    runtime.state().recorder.record_call(t)


def served(renderer: Renderer, openmetrics: bool) -> bytes:
    """The body, less the `_created` lines prometheus_client's families do not carry."""
    return re.sub(rb"(?m)^[a-z_]+_created[{ ].*\n", b"", renderer.render(openmetrics))


def reference(openmetrics=False):
    registry = CollectorRegistry()
    registry.register(exporter.collector())
    return (generate_openmetrics if openmetrics else generate_latest)(registry)


def test_text_and_openmetrics_equal_prometheus_client():
    renderer = runtime.state().renderer
    for i in range(30):
        record(model=f"m{i % 3}", tenant=f'we"ird\\{i % 4}', ttft_ms=5 + i * 97,
               gaps_ms=(1, 2000 + i, 7), outcome="ok" if i % 5 else "error")
    for openmetrics in (False, True):
        expected = reference(openmetrics)  # first: render() updates the scrape-duration gauge
        assert served(renderer, openmetrics) == expected
    # after a partial change, cached series and re-rendered ones still add up to the same bytes
    record(model="m1", tenant="we\"ird\\1", ttft_ms=2001)
    record(model="new", tenant="x")
    for openmetrics in (True, False):
        expected = reference(openmetrics)
        assert served(renderer, openmetrics) == expected


def test_slo_threshold_is_an_exact_le_boundary():
    runtime.configure({"slos": [{"ttft": {"threshold_seconds": 1.337, "target": 0.99}}]})
    record(ttft_ms=1337)
    record(ttft_ms=1338)
    text = runtime.state().renderer.render().decode()
    line = next(l for l in text.splitlines() if l.startswith(
        names.TTFT.name + '_bucket{le="1.337"'))
    assert line.endswith(" 1.0")


def test_window_quantiles_are_served_and_expire():
    clock = ManualClock()
    rec = Recorder(load({"window": {"seconds": 3, "slices": 3}}), clock)
    renderer = Renderer(rec)
    for ms in range(100, 1100, 10):  # 100 values, 100 ms .. 1090 ms, ending now
        t = CallTimeline(start=clock.now_ns - ms * MS, model="m", route="r", tenant="t",
                         provider="p")
        t.token(clock.now_ns)
        t.end = clock.now_ns
        rec.record_call(t)
    text = renderer.render().decode()
    p50 = [l for l in text.splitlines()
           if l.startswith(names.TTFT.window_name) and 'quantile="0.5"' in l]
    assert len(p50) == 1
    value = float(p50[0].split()[-1])
    assert abs(value - 0.59) / 0.59 < 0.01  # exact to HDR precision (2 digits)
    clock.advance(2.0)  # two slices later: the calls' slice is still in the window
    assert names.TTFT.window_name + "{" in renderer.render().decode()
    clock.advance(1.5)  # past the window
    text = renderer.render().decode()
    assert names.TTFT.window_name + "{" not in text
    assert names.TTFT.name + "_count{" in text  # the cumulative histogram stays


def test_counters_and_self_metrics():
    runtime.configure({"labels": {"max_tenants": 2}})
    for tenant in ("a", "b", "c", "d"):
        record(tenant=tenant)
    text = runtime.state().renderer.render().decode()
    assert 'tenant="__other__"' in text
    assert f'{names.SELF_TENANT_FOLDS}{{model="m",route="r"}} 2.0' in text
    assert f'{names.REQUESTS_TOTAL}{{model="m",outcome="ok",provider="p",route="r",' \
           f'tenant="__other__"}} 2.0' in text
    assert f'{names.SELF_DROPS}{{reason="series_limit"}} 0.0' in text


def test_exemplars_in_openmetrics_only_and_equal_to_prometheus_client():
    renderer = runtime.state().renderer
    record(ttft_ms=120, trace_id="4bf92f3577b34da6a3ce929d0e0e4736")
    record(ttft_ms=1900, trace_id="00f067aa0ba902b700f067aa0ba902b7")
    record(ttft_ms=1950)  # untraced: the bucket keeps the latest traced call
    record(ttft_ms=300, model="untraced")
    for openmetrics in (True, False):
        expected = reference(openmetrics)
        assert served(renderer, openmetrics) == expected
    om = renderer.render(True).decode()
    line = next(l for l in om.splitlines()
                if l.startswith(names.TTFT.name + '_bucket{le="2.0",model="m"'))
    assert line.endswith(" 3.0 # {trace_id=\"00f067aa0ba902b700f067aa0ba902b7\"} 1.9 " +
                         line.rsplit(" ", 1)[1])
    assert "trace_id" not in renderer.render(False).decode()
    # the ITL family (per chunk) carries no exemplars
    assert not [l for l in om.splitlines() if l.startswith(names.ITL.name) and "#" in l]


def test_every_counter_row_and_histogram_series_has_a_created_line():
    """OpenMetrics `_created`: one per counter row and histogram series (prometheus_client's
    OpenMetrics parser reads the body), at or before the series' birth and before the first
    render showing it, the same at every render; none in the 0.0.4 text format, none for the
    series and nonzero rows present when the renderer was built (an aggregator's restored
    state: a time after their real birth would count them twice)."""
    clock = ManualClock()
    rec = Recorder(load({}), clock)
    record_on(rec, clock, tenant="old")
    renderer = Renderer(rec)  # built at 1.7e9: "old" predates it
    clock.advance(10)
    renderer.render(True)  # a read at 1.7e9 + 10: what it shows first was born after 1.7e9
    clock.advance(5)
    record_on(rec, clock, tenant="new")  # born at 1.7e9 + 15
    clock.advance(5)
    first = renderer.render(True).decode()
    clock.advance(5)
    record_on(rec, clock, tenant="new")
    assert renderer.render(True).decode().count("_created") == first.count("_created")
    families = list(text_string_to_metric_families(first))
    created = {}
    for family in families:
        for s in family.samples:
            if s.name.endswith("_created"):
                created[(s.name, tuple(sorted(s.labels.items())))] = s.value
    born_new = 0
    for family in families:
        if family.type not in ("counter", "histogram"):
            assert not any(s.name.endswith("_created") for s in family.samples), family.name
            continue
        for s in family.samples:
            if not s.name.endswith(("_total", "_count")):
                continue
            at = created.get((family.name + "_created", tuple(sorted(s.labels.items()))))
            if s.labels.get("tenant") == "new":
                assert at == 1.7e9 + 10, (family.name, s.labels)  # the read before its birth
                born_new += 1
            elif s.value:  # "old", and the series "new" shares with it (no tenant label)
                assert at is None, (family.name, s.labels)
            else:  # a row at zero: zero since the build
                assert at == 1.7e9, (family.name, s.labels)
    assert born_new >= 4
    assert "_created" not in renderer.render(False).decode()


def record_on(rec: Recorder, clock: ManualClock, tenant: str) -> None:
    t = CallTimeline(start=clock.now_ns - 80 * MS, model="m", provider="p", route="r",
                     tenant=tenant)
    t.token(t.start + 50 * MS)
    t.end = t.start + 80 * MS
    t.outcome = "ok"
    rec.record_call(t)
