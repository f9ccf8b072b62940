"""`ttft-exporter diagnose`, `ttft-exporter watch` and the `LLMTTFTLikelyCause` alert on scripted
calls, read by two real Prometheus servers (classic and native histograms, each with its mode's
generated rules, each scraping a watch of its own).

One model per failure mode, plus a calm one, one slowed by a client-side wait (the queue
phase: a starved client) that fits no known cause, and one whose mean rises within its own
noise (a fifth, then a third of its calls uncached: not degraded). Each records the same calm
calls for a baseline, then its degradation; both windows are 4 s (rule windows scaled 1/75: 5m -> 4 s). The
calls are `CallTimeline`s recorded straight into the exporter's recorder, so every signal is
exactly what the script says: this is the decision on real query results, without a demo's
timing noise (tests/test_incident_day.py plays the demo's incidents). The issue-20 scenarios
(tests/support/physics.py: TTFT read by how it is made) are recorded beside them, on the same
schedule, and held to their causes by the same diagnose runs.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from exporter import cli
from exporter._internal import runtime
from exporter._internal.config import loader as config_loader
from exporter._internal import names
from exporter._internal.diagnose.causes import Finding, rise_z
from exporter._internal.evidence.thresholds import DEFAULT
from exporter._internal.diagnose.run import Prometheus, _windows, diagnose
from exporter._internal.diagnose.watch import Watch, WatchService, Windows
from exporter._internal.generate.files import RULE_FILES, generate
from exporter._internal.promql import CLASSIC
from exporter._internal.record.timeline import CallTimeline
from tests.support.physics import CALM as CALM_PHYSICS, PHYSICS, PREFILL_MS_PER_TOKEN, \
    physics_call
from tests.support.prometheus import PrometheusServer, require_prometheus, scrape_config

MS = 1_000_000  # ns
WINDOW = 4.0
SCALE = WINDOW / 300
#: The watch compares the last 4 s with 4 s ending 20 s earlier. After 20 s of calm, that
#: baseline is calm from 4 s after the change to 20 s after it: the finding lasts that long,
#: past the watch's own latency (its decision, ~1-2.5 s of queries on a busy machine, then a
#: scrape) and the alert's `for` (1.6 s).
CALM = 20.0
CONFIG = {"alerting": {"window_scale": SCALE, "tenant_window_seconds": 300,
                       "tenant_baseline_offset_seconds": 1500, "min_calls": 5}}
#: model -> the cause diagnose must name (None: not degraded).
EXPECTED = {"m-calm": None, "m-surge": "prefill_surge", "m-cold": "cold_cache",
            "m-noisy": "noisy_neighbour", "m-route": "route_change", "m-client": "unknown",
            "m-mixed": None}
TENANTS = ("t0", "t1", "t2", "t3")


def scripted(model: str, tenant: str, degraded: bool, n: int = 1) -> CallTimeline:
    """Call `n` of `model`; `degraded` plays its failure mode (EXPECTED). m-mixed's calls are
    two kinds, 0.15 s and 2.05 s (an uncached prompt): every fifth call slow, then every
    third."""
    bad = degraded and model not in ("m-calm", "m-mixed")
    queue = 400 if bad and model == "m-client" else 1
    connect = 120 if bad and model == "m-route" else 0
    server = {"m-route": 160, "m-noisy": 500}.get(model, 50) if bad else 50
    surge, cold = bad and model == "m-surge", bad and model == "m-cold" and tenant == "t0"
    prefill = 400 if surge else 350 if cold else 100
    if model == "m-mixed" and n % (3 if degraded else 5) == 0:
        prefill = 2000
    t = CallTimeline(start=0, model=model, provider="p", route="r", tenant=tenant)
    t.dispatched = queue * MS
    t.connected = t.dispatched + connect * MS
    t.sent = t.connected + MS
    t.headers = t.sent + server * MS
    at = t.headers + prefill * MS
    for i in range(10):
        t.token(at)
        at += (2000 if bad and model == "m-noisy" and i == 4 else 20) * MS
    t.end = at
    t.outcome = "ok"
    t.input_tokens = 8000 if surge else 2000
    t.cached_input_tokens = 0 if cold else 1200
    t.output_tokens = 10
    far = bad and model == "m-route"
    t.upstream_address = "10.9.9.9:443" if far else "10.0.0.1:443"
    t.upstream_region, t.fingerprint = ("far" if far else "near"), "fp_1"
    return t


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_prometheus()
    out = tmp_path_factory.mktemp("diagnose")
    proms: dict[str, PrometheusServer] = {}
    watches: dict[str, WatchService] = {}
    cfg = config_loader.load(CONFIG)
    runtime.configure(cfg)
    server = runtime.start_http_server(port=0)
    target = server.url.split("//", 1)[1].split("/", 1)[0]
    stop, degraded = threading.Event(), threading.Event()

    def feed() -> None:  # every model and tenant about 4 calls/s; t0 of m-cold twice that
        recorder = runtime.state().recorder
        calls = dict.fromkeys(EXPECTED, 0)
        physics = dict.fromkeys((*PHYSICS, *CALM_PHYSICS), 0)
        while not stop.wait(0.25):
            for model in EXPECTED:
                for tenant in TENANTS + (("t0",) if model == "m-cold" else ()):
                    calls[model] += 1
                    recorder.record_call(scripted(model, tenant, degraded.is_set(),
                                                  calls[model]))
            for model, route in physics:  # every (model, route) and tenant 4 calls/s
                for tenant in TENANTS:
                    physics[(model, route)] += 1
                    recorder.record_call(physics_call(model, route, tenant, degraded.is_set(),
                                                      physics[(model, route)]))

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        for mode in ("classic", "native"):
            mode_cfg = config_loader.load({**CONFIG, "dashboards": {"histograms": mode}})
            generate(mode_cfg, out / mode)
            rules = [out / mode / "alerts" / f for f in RULE_FILES]
            flags = ["--enable-feature=native-histograms"] if mode == "native" else []
            watches[mode] = WatchService(Watch(None, Windows.of(mode_cfg.alerting)),
                                         "127.0.0.1", 0).start(1.0)
            proms[mode] = PrometheusServer(scrape_config(target, watch=watches[mode].target),
                                           rule_files=rules, extra_flags=flags)
            watches[mode].decide(Prometheus(proms[mode].url))
        for prom in proms.values():
            prom.wait_for('up{job="ttft-exporter"} == 1', timeout=30)
        feeder.start()
        time.sleep(CALM)  # paces the script: the calm baseline, then the degradation
        changed = time.time()
        degraded.set()
        time.sleep(WINDOW + 4)  # a full window of it, and the alerts' `for` (1.6 s)
        at = time.time()
        # The alerts as they are once every expected one fires (or 15 s on): a rule group
        # evaluation can take longer than its second when the machine is busy.
        expected = sum(1 for cause in EXPECTED.values() if cause)
        models = "|".join(EXPECTED)
        for prom in proms.values():
            with contextlib.suppress(TimeoutError):  # the assertions say what is missing
                prom.wait_for(f'count(ALERTS{{alertname="LLMTTFTLikelyCause", '
                              f'alertstate="firing", model=~"{models}"}}) >= {expected}',
                              timeout=15)
        alerts = {mode: prom.alerts() for mode, prom in proms.items()}
        yield {"proms": proms, "at": at, "changed": changed, "alerts": alerts, "findings": {}}
    finally:
        stop.set()
        for watch in watches.values():
            watch.stop()
        for prom in proms.values():
            prom.stop()
        server.stop()
        runtime.configure(None)


def diagnose_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exporter.cli", "diagnose", "--prometheus",
                           url, *args], capture_output=True, text=True, timeout=60)


def windows(run: dict[str, Any]) -> list[str]:
    """The last 4 s of the script against 4 s ending a second before the degradation (a scrape
    stamped just before the change may be served just after it, on a loaded machine)."""
    return ["--at", f"{run['at']:.3f}", "--since", f"{WINDOW:g}s", "--baseline",
            f"{WINDOW:g}s", "--baseline-at", f"{run['changed'] - 1:.3f}", "--min-calls", "5"]


def findings_of(run: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """`diagnose --json` over the script's windows (`windows`), run once per mode."""
    if mode not in run["findings"]:
        proc = diagnose_cli(run["proms"][mode].url, "--json", *windows(run))
        assert proc.returncode == 0, proc.stderr
        run["findings"][mode] = json.loads(proc.stdout)
    return run["findings"][mode]


@pytest.mark.parametrize("mode", ["classic", "native"])
def test_diagnose_names_each_scripted_cause(run: dict[str, Any], mode: str) -> None:
    every = findings_of(run, mode)
    # nothing named but the degraded models of both scripts (the calm ones, m-calm and m-mixed,
    # named nothing), each once
    assert sorted((f["model"], f["route"]) for f in every) == sorted(
        {(m, "r") for m, c in EXPECTED.items() if c} | set(PHYSICS)), every
    findings = [f for f in every if f["model"] in EXPECTED]
    got = {f["model"]: f["cause"] for f in findings}
    assert got == {m: c for m, c in EXPECTED.items() if c}, findings
    by_model = {f["model"]: f for f in findings}
    assert by_model["m-cold"]["tenants"] == ["t0"]
    assert by_model["m-noisy"]["tenants"] == [] and by_model["m-route"]["tenants"] == []
    for f in findings:
        assert set(f) >= {"model", "route", "cause", "tenants", "evidence", "runbook"}
        assert f["route"] == "r" and f["runbook"].startswith("https://")
        assert all(isinstance(v, (int, float)) for v in f["evidence"].values())
    assert by_model["m-surge"]["evidence"]["input_tokens_per_call_now"] == pytest.approx(8000)
    assert by_model["m-surge"]["evidence"]["input_tokens_per_call_baseline"] == \
        pytest.approx(2000)
    assert by_model["m-route"]["evidence"]["new_upstream_share"] == pytest.approx(1.0)
    assert by_model["m-cold"]["evidence"]["cached_share[t0]_now"] == 0


@pytest.mark.parametrize("mode", ["classic", "native"])
def test_diagnose_names_each_scenario_by_how_ttft_is_made(run: dict[str, Any],
                                                           mode: str) -> None:
    findings = {(f["model"], f["route"]): f for f in findings_of(run, mode)
                if (f["model"], f["route"]) in PHYSICS}
    assert {k: f["cause"] for k, f in findings.items()} == PHYSICS, findings
    surge = findings[("m-surge-cached", "r")]["evidence"]
    # the prefill grew with the uncached work, at the server's usual speed (0.2 s per 1k;
    # rate() extrapolates each series at the window's edges: ratios of two are a little off)
    # (a scrape stamped just before the change may be served after it: a few calls off)
    assert surge["uncached_input_tokens_per_call_now"] == pytest.approx(8000, rel=0.1)
    assert surge["uncached_input_tokens_per_call_baseline"] == pytest.approx(400, rel=0.25)
    for key in ("now", "baseline"):
        assert surge[f"prefill_seconds_per_1k_uncached_tokens_{key}"] == \
            pytest.approx(PREFILL_MS_PER_TOKEN, rel=0.15)
    assert findings[("m-surge-tenant", "r")]["tenants"] == ["t0"]
    assert findings[("m-surge-cached", "r")]["tenants"] == []
    assert findings[("m-two", "near")]["evidence"]["new_upstream_share"] == 0


@pytest.mark.parametrize("mode", ["classic", "native"])
def test_issue_32s_wrong_answers_are_named_by_their_mechanism(run: dict[str, Any],
                                                              mode: str) -> None:
    """Each of issue 32's wrong answers (tests/support/physics.py), by the signal that names it
    now: the names themselves are held by the test above."""
    found = {(f["model"], f["route"]): f for f in findings_of(run, mode)}
    cold = found[("m-cache-fleet", "a")]
    # every tenant lost its cache on route a (b keeps it: per tenant over the model, half)
    assert cold["cause"] == "cold_cache" and cold["tenants"] == [], cold
    assert cold["evidence"]["cached_share_now"] == 0
    assert cold["evidence"]["cached_share_baseline"] == pytest.approx(0.85, abs=0.01)
    assert ("m-cache-fleet", "b") not in found
    saturate = found[("m-saturate", "r")]["evidence"]
    # slower per token than the old ceiling allowed (2x): attention over a longer context
    assert saturate["prefill_seconds_per_1k_uncached_tokens_now"] > \
        2 * saturate["prefill_seconds_per_1k_uncached_tokens_baseline"], saturate
    overload = found[("m-overload", "r")]["evidence"]
    # the queue rose (the pool waits on longer calls) beside the provider's retries
    assert overload["retries_per_call_now"] == pytest.approx(1 / 15, rel=0.5), overload
    assert overload["stall_mean_seconds_now"] > 0.3, overload
    reasoning = found[("m-reasoning", "r")]["evidence"]
    # 3 s more before the first visible token, the stalls as they were, more output tokens
    assert reasoning["stall_mean_seconds_now"] == pytest.approx(
        reasoning["stall_mean_seconds_baseline"], rel=0.05), reasoning
    assert reasoning["output_tokens_per_call_now"] == pytest.approx(310, rel=0.1), reasoning
    assert found[("m-rollout", "r")]["evidence"]["uncached_input_tokens_per_call_now"] == \
        pytest.approx(8000, rel=0.1)


def test_a_route_filtered_to_a_fleet_wide_cache_loss_names_it(run: dict[str, Any]) -> None:
    proc = diagnose_cli(run["proms"]["classic"].url, "--json", *windows(run), "--model",
                        "m-cache-fleet", "--route", "a")
    assert proc.returncode == 0, proc.stderr
    assert [(f["route"], f["cause"]) for f in json.loads(proc.stdout)] == [("a", "cold_cache")]


def test_an_incident_longer_than_the_baseline_offset_is_still_found(
        run: dict[str, Any]) -> None:
    """The watch's windows with an offset shorter than the incident so far: the baseline one
    offset back lies inside the incident (compared with itself, nothing is degraded), the one
    two offsets back ends before it: the watch and diagnose take that one."""
    lasted = run["at"] - run["changed"]  # at least WINDOW + 4 = 8 s
    since = 3.0  # a window of 3 s fits inside the incident one offset back
    offset = (lasted + 1) / 2  # two offsets back: a second before the change
    assert offset + since <= lasted
    windows_ = Windows(since, offset, (), replace(DEFAULT, min_calls=5))
    req = windows_.request(run["at"])
    assert req.candidates == 3
    prom = Prometheus(run["proms"]["classic"].url)

    def scripted(findings: list[Finding]) -> dict[str, Finding]:
        return {f.model: f for f in findings if f.model in EXPECTED}

    assert scripted(diagnose(prom, replace(req, candidates=1), windows_.thresholds)) == {}
    found = scripted(diagnose(prom, req, windows_.thresholds))
    # the choice reads the route's TTFT mean: m-cold's one cold tenant moves it by the
    # degraded floor (0.1 s) and no more, so its baseline may stay the one inside the
    # incident (docs/diagnose.md, blind spots); named, it is named right
    assert {m: f.cause for m, f in found.items() if m != "m-cold"} == {
        m: c for m, c in EXPECTED.items() if c and m != "m-cold"}
    assert found.get("m-cold") is None or found["m-cold"].cause == "cold_cache"
    assert {f.evidence["baseline_windows_back"] for m, f in found.items()
            if m != "m-cold"} == {1}


def test_a_rise_within_its_own_noise_is_not_degraded(run: dict[str, Any]) -> None:
    """m-mixed's mean rose past the factor and the floor (1.25x, 0.1 s), by fewer than the
    gate's 3.5 standard errors: no finding (the test above), nothing served by the watch, no alert."""
    prom = Prometheus(run["proms"]["classic"].url)
    with ThreadPoolExecutor(max_workers=8) as pool:
        now = _windows(prom, run["at"], WINDOW, ['model="m-mixed"'], CLASSIC, pool)
        base = _windows(prom, run["changed"] - 1, WINDOW, ['model="m-mixed"'], CLASSIC, pool)
    now_w, base_w = now[("m-mixed", "r")], base[("m-mixed", "r")]
    assert now_w.ttft >= 1.25 * base_w.ttft and now_w.ttft - base_w.ttft >= 0.1, (now_w, base_w)
    z = rise_z(now_w, base_w, "ttft")  # on log values, from the buckets
    assert z is not None and 0 < z < DEFAULT.degraded_z, (now_w, base_w, z)


def test_diagnose_is_quiet_over_the_calm_baseline(run: dict[str, Any]) -> None:
    proc = diagnose_cli(run["proms"]["classic"].url, "--json", "--at", f"{run['changed']:.3f}",
                        "--since", "3s", "--baseline", "3s", "--min-calls", "5")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_the_table_names_the_cause_and_the_tenants(run: dict[str, Any]) -> None:
    proc = diagnose_cli(run["proms"]["classic"].url, *windows(run), "--model", "m-cold")
    assert proc.returncode == 0, proc.stderr
    assert "m-cold / r: cold_cache  (t0)" in proc.stdout, proc.stdout
    assert "cached_share[t0]" in proc.stdout and "runbook: https://" in proc.stdout


@pytest.mark.parametrize("mode", ["classic", "native"])
def test_the_watch_serves_and_the_alert_fires_the_causes_diagnose_names(run: dict[str, Any],
                                                                       mode: str) -> None:
    prom = run["proms"][mode]
    recorded = {(r["metric"]["model"], r["metric"]["cause"], r["metric"].get("tenant"))
                for r in prom.query(names.LIKELY_CAUSE, at=run["at"])
                if r["metric"]["model"] in EXPECTED}  # (the issue-20 scenarios: diagnose's)
    assert recorded == {(m, c, "t0" if c == "cold_cache" else None)
                        for m, c in EXPECTED.items() if c}, recorded
    alerts = [a for a in run["alerts"][mode] if a["labels"].get("model") in EXPECTED]
    firing = {(a["labels"]["model"], a["labels"]["cause"]) for a in alerts
              if a["labels"]["alertname"] == "LLMTTFTLikelyCause" and a["state"] == "firing"}
    assert firing == {(m, c) for m, c in EXPECTED.items() if c}, firing
    cold = next(a for a in alerts if a["labels"].get("cause") == "cold_cache")
    assert "tenant t0" in cold["annotations"]["description"]


def test_unreachable_prometheus_and_bad_arguments_are_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    closed = diagnose_cli("http://127.0.0.1:9")  # the discard port: nothing listens
    assert closed.returncode == 2 and closed.stdout == ""
    assert closed.stderr.startswith("ttft-exporter diagnose: cannot query Prometheus at "
                                    "http://127.0.0.1:9"), closed.stderr
    assert len(closed.stderr.splitlines()) == 1
    # The bad arguments in-process (cli.main's status is the process's: `sys.exit(main())`),
    # sparing an interpreter start each.
    for url, args, says in (("http://127.0.0.1:9", ["--since", "soon"], "not a duration: 'soon'"),
                            ("http://127.0.0.1:9", ["--at", "yesterday"],
                             "not a time: 'yesterday'"),
                            ("127.0.0.1:9090", [], "must be an http(s) URL")):
        assert cli.main(["diagnose", "--prometheus", url, *args]) == 2
        out, err = capsys.readouterr()
        assert out == "" and says in err and len(err.splitlines()) == 1, err


def one_line_exit_2(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """cli.main in-process (its status is the process's: `sys.exit(main())`): exit 2, nothing on
    stdout, one line on stderr saying `says`, no traceback."""
    try:
        status = cli.main(args)
    except SystemExit as e:  # argparse exits from inside parse_args
        status = e.code
    out, err = capsys.readouterr()
    assert status == 2 and out == "", (status, out)
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_overlapping_or_inverted_windows_are_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["diagnose", "--prometheus", "http://127.0.0.1:9", "--at", "1000000",
            "--since", "10m"]
    for baseline_at in ("999900", "1000500"):  # inside the diagnosed window; after it
        one_line_exit_2([*base, "--baseline-at", baseline_at],
                        "must end by the start of the diagnosed window", capsys)


def test_a_port_that_is_no_number_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    one_line_exit_2(["diagnose", "--prometheus", "http://127.0.0.1:90x90"], "bad port", capsys)


def test_a_listener_that_does_not_speak_http_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A real socket on loopback answering an SSH banner: http.client's BadStatusLine."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(4096)
                    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        one_line_exit_2(["diagnose", "--prometheus", f"http://127.0.0.1:{port}"],
                        "does not answer HTTP", capsys)
    finally:
        listener.close()


def test_argparse_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    one_line_exit_2(["diagnose"], "the following arguments are required: --prometheus", capsys)
    one_line_exit_2(["diagnose", "--prometheus", "http://127.0.0.1:9", "--min-calls", "many"],
                    "invalid int value: 'many'", capsys)
    one_line_exit_2(["diagnose", "--prometheus", "http://127.0.0.1:9", "--no-such-flag"],
                    "unrecognized arguments: --no-such-flag", capsys)
    # a query timeout of zero or less would fail every query (the watch's check, shared)
    one_line_exit_2(["diagnose", "--prometheus", "http://127.0.0.1:9", "--timeout", "0"],
                    "must be above 0", capsys)


def test_a_prometheus_without_the_exporters_data_is_an_error(run: dict[str, Any]) -> None:
    proc = diagnose_cli(run["proms"]["classic"].url, "--model", "no-such-model")
    assert proc.returncode == 2
    assert "has no llm_client_time_to_first_token_seconds series matching" in proc.stderr


def test_a_success_without_data_result_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A real HTTP server on loopback answering every query 200 with `status: success` and no
    `data.result` (a proxy or another API behind the URL): one line, exit 2, no KeyError."""
    from aiohttp import web

    from exporter._internal.expose.http_thread import HttpThread

    async def query(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": {}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/query", query)
    server = HttpThread(app, "127.0.0.1", 0, name="not-prometheus")
    server.start()
    try:
        one_line_exit_2(["diagnose", "--prometheus", server.base_url],
                        "answered success without a data.result list", capsys)
    finally:
        server.stop()
