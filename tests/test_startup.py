"""Start-up: `import exporter; exporter.instrument()` loads the caller's side only, imports no
SDK the application did not import, and patches an SDK when the application imports it (later,
on another thread, while instrumenting, or again through `importlib.reload`). Each check runs
in a fresh interpreter: this one has imported everything already."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prometheus_client.openmetrics.parser import text_string_to_metric_families

from exporter._internal import names, runtime
from exporter._internal.config import settings
from exporter._internal.config.settings import Config, LabelConfig, ServerConfig
from exporter._internal.demo.provider import SCRIPT_HEADER, ProviderServer
from exporter._internal.expose import closed_connections, families, server
from exporter._internal.expose.text import Renderer
from exporter._internal.expose.textformat import OPENMETRICS, PROTOBUF, TEXT
from exporter._internal.fleet import push
from exporter._internal.record.guard import EPOCHS
from exporter._internal.record.recorder import Recorder
from tests.support.clock import ManualClock
from tests.test_exposition import record_on
from tests.test_protobuf_exposition import text_samples

ROOT = Path(__file__).resolve().parent.parent
INTERNAL = ROOT / "exporter" / "_internal"

#: What the caller's process never loads at start-up: the SDK it did not import, the server,
#: the exposition, the push worker, the later stages, OpenTelemetry, the config's YAML loader.
SERVER_SIDE = ("anthropic", "aiohttp", "opentelemetry", "prometheus_client", "yaml",
               "exporter._internal.expose", "exporter._internal.fleet",
               "exporter._internal.generate", "exporter._internal.diagnose",
               "exporter._internal.view", "exporter._internal.demo",
               "exporter._internal.config.loader")

#: Hooks of the openai SDK checked in the children: (module, class, attribute).
OPENAI_HOOKS = (("openai._base_client", "SyncAPIClient", "request"),
                ("openai._streaming", "Stream", "__stream__"),
                ("openai.resources.chat.completions.completions", "Completions", "create"))

#: The children's helpers: is a hook ours, and one measured streamed call against the provider.
PRELUDE = """
import importlib, json, sys, threading
import exporter
from exporter._internal import names, runtime

def patched(module, cls, attr):
    fn = getattr(getattr(sys.modules[module], cls), attr)
    while fn is not None:
        if getattr(fn, "__ttft_exporter_hook__", False):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False

def measured_stream(base_url, header):
    import openai
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="test", max_retries=0)
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
        extra_headers={header: '{"tokens": 3}'}))
    rows = runtime.state().recorder.counts().rows[names.REQUESTS_TOTAL]
    return len(chunks), sum(rows.values())
"""


def in_child(code: str, *args: str) -> dict:
    """Run `code` (after PRELUDE) in a fresh interpreter; what it printed last, as JSON."""
    run = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def provider():
    with ProviderServer() as running:
        yield running


def test_instrument_imports_no_sdk_the_app_did_not_import():
    """anthropic is installed here; a service that imports only openai does not load it, nor
    the openai resources it never used."""
    out = in_child("""
        before = set(sys.modules)  # exporter and PRELUDE's imports: nothing of an SDK
        import openai
        with_openai = set(sys.modules)
        measured = exporter.instrument()
        print(json.dumps({"measured": measured, "before": sorted(before),
                          "added": sorted(set(sys.modules) - with_openai)}))
    """)
    assert not [m for m in out["before"] if m.startswith(("openai", "anthropic"))]
    assert out["measured"] == ["openai", "anthropic"]  # anthropic: patched once imported
    assert not [m for m in out["added"] if not m.startswith("exporter.")], out["added"]


def test_the_callers_closure_holds_no_server_side():
    out = in_child("""
        exporter.instrument()
        alone = sorted(sys.modules)
        import openai
        with_openai = set(sys.modules)
        exporter.instrument()
        print(json.dumps({"alone": alone, "added": sorted(set(sys.modules) - with_openai)}))
    """)
    for modules in (out["alone"], out["added"]):
        assert [m for m in modules if m.startswith(SERVER_SIDE)] == []
    assert "exporter._internal.shim.hooks" in out["alone"]


def test_an_sdk_imported_after_instrument_is_patched_and_measured(provider):
    out = in_child("""
        measured = exporter.instrument()
        imported = "openai" in sys.modules
        chunks, calls = measured_stream(sys.argv[1], sys.argv[2])
        print(json.dumps({"measured": measured, "imported": imported, "chunks": chunks,
                          "calls": calls, "hooks": [patched(*h) for h in HOOKS]}))
    """.replace("HOOKS", repr(OPENAI_HOOKS)), provider.base_url, SCRIPT_HEADER)
    assert out["measured"] == ["openai", "anthropic"] and not out["imported"]
    assert out["hooks"] == [True, True, True]
    assert (out["chunks"], out["calls"]) == (5, 1)  # 3 tokens, a role chunk, the finish


def test_an_sdk_imported_on_another_thread_after_instrument_is_measured(provider):
    out = in_child("""
        exporter.instrument()
        result = {}
        worker = threading.Thread(target=lambda: result.update(
            zip(("chunks", "calls"), measured_stream(sys.argv[1], sys.argv[2]))))
        worker.start()
        worker.join()
        print(json.dumps({**result, "hooks": [patched(*h) for h in HOOKS]}))
    """.replace("HOOKS", repr(OPENAI_HOOKS)), provider.base_url, SCRIPT_HEADER)
    assert out == {"chunks": 5, "calls": 1, "hooks": [True, True, True]}


def test_uninstrument_before_the_import_leaves_it_unpatched(provider):
    out = in_child("""
        exporter.instrument()
        exporter.uninstrument()
        chunks, calls = measured_stream(sys.argv[1], sys.argv[2])
        from exporter._internal.shim import instrument
        print(json.dumps({"chunks": chunks, "calls": calls, "watched": len(instrument._watched),
                          "measured": instrument.instrumented(),
                          "hooks": [patched(*h) for h in HOOKS]}))
    """.replace("HOOKS", repr(OPENAI_HOOKS)), provider.base_url, SCRIPT_HEADER)
    assert out == {"chunks": 5, "calls": 0, "watched": 0, "measured": [],
                   "hooks": [False, False, False]}


def test_a_module_another_thread_is_importing_while_instrumenting_is_patched():
    """The other thread's import found its module before instrument() watched it, and is still
    running its code when instrument() looks: instrument() waits for it, then patches it."""
    out = in_child("""
        from importlib.machinery import PathFinder

        class Paused:  # holds the other thread inside completions.py, importing .messages
            go = threading.Event()
            def find_spec(self, name, path=None, target=None):
                if name != "openai.resources.chat.completions.messages":
                    return None
                spec = PathFinder.find_spec(name, path, target)
                spec.loader = Paused.Loader(spec.loader)
                return spec

            class Loader:
                def __init__(self, loader):
                    self.loader = loader
                def create_module(self, spec):
                    return self.loader.create_module(spec)
                def exec_module(self, module):
                    module.__spec__.loader = module.__loader__ = self.loader
                    started.set()
                    Paused.go.wait(30)
                    self.loader.exec_module(module)

        started = threading.Event()
        import openai
        sys.meta_path.insert(0, Paused())
        worker = threading.Thread(
            target=importlib.import_module,
            args=("openai.resources.chat.completions.completions",))
        worker.start()
        started.wait(30)
        threading.Timer(0.5, Paused.go.set).start()  # instrument() is waiting by then
        measured = exporter.instrument()
        worker.join()
        print(json.dumps({"measured": measured, "hooks": [patched(*h) for h in HOOKS]}))
    """.replace("HOOKS", repr(OPENAI_HOOKS)))
    assert out == {"measured": ["openai", "anthropic"], "hooks": [True, True, True]}


def test_imports_racing_instrument_on_many_threads_end_patched():
    out = in_child("""
        start = threading.Barrier(9)
        modules = ["openai", "openai.resources.chat.completions.completions",
                   "openai.resources.responses.responses", "anthropic"] * 2

        def importer(name):
            # the package first, as applications import it: several threads importing
            # openai's submodules before the package fails in CPython without the exporter
            # (a circular import inside openai.lib; measured 6 of 12 runs)
            start.wait()
            importlib.import_module(name.split(".")[0])
            importlib.import_module(name)

        workers = [threading.Thread(target=importer, args=(m,)) for m in modules]
        for w in workers:
            w.start()
        start.wait()
        measured = exporter.instrument()
        for w in workers:
            w.join()
        hooks = HOOKS + (("openai.resources.responses.responses", "Responses", "create"),
                         ("anthropic._base_client", "SyncAPIClient", "request"),
                         ("anthropic.resources.messages.messages", "Messages", "create"))
        print(json.dumps({"measured": measured, "hooks": [patched(*h) for h in hooks]}))
    """.replace("HOOKS", repr(OPENAI_HOOKS)))
    assert out == {"measured": ["openai", "anthropic"], "hooks": [True] * 6}


def test_a_reloaded_module_is_patched_again_and_restored_on_uninstrument():
    out = in_child("""
        import openai.resources.chat.completions.completions as module
        exporter.instrument()
        old = module.Completions
        importlib.reload(module)
        new = module.Completions
        patched_after_reload = [patched(*h) for h in HOOKS]
        loader_kept = type(module.__loader__).__name__ == "SourceFileLoader" and \\
            module.__spec__.loader is module.__loader__
        exporter.uninstrument()
        print(json.dumps({"fresh_class": new is not old, "patched": patched_after_reload,
                          "loader_kept": loader_kept,
                          "restored": ["__ttft_exporter_hook__" not in dir(cls.create)
                                       for cls in (old, new)]}))
    """.replace("HOOKS", repr(OPENAI_HOOKS)))
    assert out == {"fresh_class": True, "patched": [True, True, True], "loader_kept": True,
                   "restored": [True, True]}


def test_each_lazily_loaded_part_works_when_first_used():
    """A fresh interpreter: the server, the collector, OpenTelemetry's spans and the push
    worker, each loaded by its first use after start-up."""
    out = in_child("""
        import urllib.request
        exporter.instrument()
        loaded = lambda prefix: any(m.startswith(prefix) for m in sys.modules)
        with exporter.track(model="m", provider="p") as call:
            call.token()
        served = exporter.start_http_server(port=0)
        body = urllib.request.urlopen(served.url).read().decode()
        families = [f.name for f in exporter.collector().collect()]

        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(tracer_provider)
        with exporter.track(model="m", provider="p") as call:
            call.token()

        before_push = loaded("exporter._internal.fleet")
        exporter.configure({"push_url": "http://127.0.0.1:9"})
        flusher = runtime.current_flusher() is not None
        exporter.configure(None)
        print(json.dumps({"served": "llm_client_requests_total" in body,
                          "collected": "llm_client_requests" in families,
                          "spans": [s.name for s in spans.get_finished_spans()],
                          "fleet_before_push": before_push, "flusher": flusher}))
    """)
    assert out == {"served": True, "collected": True, "spans": ["chat m"],
                   "fleet_before_push": False, "flusher": True}


#: What a first call never loads in a process that does not serve (no server, no collector, no
#: push), beyond what the application imported: the exposition, the push worker and what only
#: they use.
NOT_LOADED_BY_A_CALL = ("aiohttp", "prometheus_client", "exporter._internal.expose",
                        "exporter._internal.fleet")


def test_a_first_call_loads_only_the_recorder_and_the_first_scrape_serves_it(provider):
    """The renderer is built at the first scrape, yet the call made before it debuts at zero
    for a scraper, then shows its value, dated from the state's birth (its first call)."""
    out = in_child("""
        import time, urllib.request
        import openai  # (which imports aiohttp's client)
        with_openai = set(sys.modules)
        exporter.instrument()
        before = set(sys.modules)
        started = time.time()
        chunks, calls = measured_stream(sys.argv[1], sys.argv[2])
        ended = time.time()
        after_call = sorted(set(sys.modules) - with_openai)
        served = exporter.start_http_server(port=0)
        def scrape(scraper):
            headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
            if scraper:
                headers["X-Prometheus-Scrape-Timeout-Seconds"] = "10"
            request = urllib.request.Request(served.url, headers=headers)
            return urllib.request.urlopen(request).read().decode()
        bodies = [scrape(True), scrape(True), scrape(False)]
        served.stop()
        print(json.dumps({"calls": calls, "after_call": after_call,
                          "loaded": sorted(set(after_call) - before), "started": started,
                          "ended": ended, "bodies": bodies}))
    """, provider.base_url, SCRIPT_HEADER)
    assert out["calls"] == 1
    assert [m for m in out["after_call"] if m.startswith(NOT_LOADED_BY_A_CALL)] == []  # at all
    ours = [m for m in out["loaded"] if m.startswith("exporter")]
    assert "exporter._internal.record.recorder" in ours
    assert [m for m in ours if not m.startswith(("exporter._internal.record",
                                                 "exporter._internal.config",
                                                 "exporter._internal.shim"))] == []

    def of_the_call(body: str) -> tuple[float, float, float | None]:
        """The call's requests row, its TTFT series' count, and that series' created time."""
        requests = count = created = None
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.labels.get("model") != "m":
                    continue
                if sample.name == names.REQUESTS_TOTAL:
                    requests = sample.value
                elif sample.name == names.TTFT.name + "_count":
                    count = sample.value
                elif sample.name == names.TTFT.name + "_created":
                    created = sample.value
        return requests, count, created

    debut, second, person = (of_the_call(body) for body in out["bodies"])
    assert debut[:2] == (0, 0) and second[:2] == (1, 1) and person[:2] == (1, 1)
    assert debut[2] == second[2] == person[2]
    assert out["started"] <= debut[2] <= out["ended"]


def test_a_renderer_built_at_the_first_scrape_serves_what_one_built_with_its_recorder_would(
        monkeypatch):
    """Twin recorders on twin clocks get the same calls, drops and label expiry; one renderer is
    built with its recorder, the other (`at_birth`, as runtime builds a process's) only at the
    first scrape. Every body, in every format, for two scrapers and a person, across deliveries,
    is the same: what was recorded before the first scrape debuts and carries its created time.
    """
    # a fresh process's closed-connection counts (none), as `at_birth` assumes: the suite's
    # other servers have closed connections in this one, and may close more mid-test
    monkeypatch.setattr(families, "CLOSED", dict.fromkeys(closed_connections.REASONS, 0))
    config = Config(labels=LabelConfig(expire_seconds=60.0))
    clocks = ManualClock(), ManualClock()
    recorders = [Recorder(config, clock) for clock in clocks]
    eager = Renderer(recorders[0])

    def both(step, *args) -> None:
        for rec, clock in zip(recorders, clocks):
            step(rec, clock, *args)

    both(record_on, "gone")
    for _ in range(EPOCHS + 1):  # each reader's lock an epoch later: "gone" expires
        both(lambda rec, clock: clock.advance(16))
        both(lambda rec, clock: rec.counts())
    assert recorders[0].removals == recorders[1].removals > 0  # all before the first scrape
    both(record_on, "a")
    both(lambda rec, clock: rec.count_drop(names.DROP_BAD_VALUE))
    both(lambda rec, clock: clock.advance(3))
    lazy = Renderer(recorders[1], at_birth=True)
    renderers = (eager, lazy)

    def bodies(kind: str, scraper: str | None, deliver: bool) -> list[bytes]:
        out = []
        for renderer in renderers:
            renderer.last_scrape_seconds = 0.0  # (the one value a render's own speed sets)
            answer = renderer.scrape(kind, scraper)
            if deliver:
                renderer.delivered(answer.delivery)
            out.append(answer.body)
        return out

    first = bodies(OPENMETRICS, "prom", deliver=True)
    assert first[0] == first[1]
    requests = {labels: v for (name, labels), v in text_samples(first[1].decode()).items()
                if name == names.REQUESTS_TOTAL and ("tenant", "a") in labels}
    assert list(requests.values()) == [0]  # its debut
    for step in range(3):
        for kind in (TEXT, OPENMETRICS, PROTOBUF):
            for scraper, deliver in (("prom", True), ("replica", step == 1), (None, False)):
                a, b = bodies(kind, scraper, deliver)
                assert a == b, (step, kind, scraper)
        both(record_on, f"t{step}")
        both(lambda rec, clock: clock.advance(2))


def _changed(value: object) -> object:
    """Another value of the same kind (a nested config type: unchanged)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):
        return value + value[:1] if value else ("x",)
    return value


def test_the_config_types_compare_hash_and_print_as_frozen_dataclasses():
    """settings.py writes their equality, hash and repr once, not per class (import cost): each
    type behaves as its twin made by `@dataclass(frozen=True)`, field by field."""
    types = [cls for cls in vars(settings).values()
             if isinstance(cls, type) and dataclasses.is_dataclass(cls)]
    assert len(types) == 12
    for cls in types:
        fields = dataclasses.fields(cls)
        twin = dataclasses.dataclass(frozen=True)(type(cls.__name__, (), {
            "__annotations__": {f.name: f.type for f in fields},
            "__qualname__": cls.__qualname__, **{f.name: f.default for f in fields}}))
        default = {f.name: f.default for f in fields}
        variants = [default] + [{**default, f.name: _changed(f.default)} for f in fields]
        ours, theirs = [cls(**v) for v in variants], [twin(**v) for v in variants]
        assert [repr(x) for x in ours] == [repr(x) for x in theirs]
        assert [hash(x) for x in ours] == [hash(x) for x in theirs]
        assert [[x == y for y in ours] for x in ours] == \
            [[x == y for y in theirs] for x in theirs]
        assert ours[0] != theirs[0] and ours[0] != None  # noqa: E711 (__eq__ of another type)
        for name in default:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(ours[0], name, None)


def test_runtime_keeps_the_values_it_reads_without_importing_their_owners():
    assert runtime._PUSH_URL_ENV == push.ENV_URL
    assert runtime._CLOSED_CONNECTIONS == closed_connections.__name__
    assert (runtime.DEFAULT_ADDR, runtime.DEFAULT_PORT) == \
        (ServerConfig.addr, ServerConfig.port) == (server.DEFAULT_ADDR, server.DEFAULT_PORT)


# --- the stages import downward ------------------------------------------------------------

#: Which stages each stage's modules may import when they load (function bodies and
#: TYPE_CHECKING blocks aside: those run when used). compat (the standard library's
#: version differences), names, config and promql are below all; the caller's side (shim, and
#: runtime as it loads) reaches record and nothing later.
MAY_IMPORT = {
    "compat": set(),
    "names": {"compat"},
    "config": {"compat", "names"},
    "promql": {"compat", "names", "config"},
    "evidence": {"compat", "names", "config", "promql"},
    "record": {"compat", "names", "config"},
    "runtime": {"compat", "names", "config", "record"},
    "shim": {"compat", "names", "config", "record", "runtime"},
    "expose": {"compat", "names", "config", "promql", "record"},
    "fleet": {"compat", "names", "config", "promql", "record", "expose"},
    "generate": {"compat", "names", "config", "promql", "evidence", "record", "expose", "fleet"},
    "diagnose": {"compat", "names", "config", "promql", "evidence", "record", "expose", "fleet",
                 "generate"},
    "view": {"compat", "names", "config", "promql", "evidence", "record", "expose", "fleet",
             "generate", "diagnose"},
}
#: Imports against the direction, each with its reason (none: the causes, thresholds and
#: signals that generate/ and diagnose/ share live below both, in evidence/).
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["exporter", "_internal"] else ""


def _imports_at_load(path: Path, package: list[str]) -> set[str]:
    """The exporter modules a module imports while it loads."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                found.update([module] if node.module else
                             [f"{module}.{alias.name}" for alias in node.names])
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit([n for n in getattr(node, field, []) if isinstance(n, ast.AST)])

    visit(ast.parse(path.read_text()).body)
    return {m for m in found if m.startswith("exporter")}


def test_stages_import_only_downward():
    against = set()
    for path in sorted(INTERNAL.rglob("*.py")):
        parts = ["exporter", "_internal", *path.relative_to(INTERNAL).with_suffix("").parts]
        package = parts[:-1]
        stage = _stage(".".join(parts))
        if stage not in MAY_IMPORT:
            continue  # demo uses everything, as an app would
        for target in _imports_at_load(path, package):
            other = _stage(target)
            if other and other != stage and other not in MAY_IMPORT[stage]:
                against.add((stage, other, str(path.relative_to(ROOT)), target))
    assert {(s, o) for s, o, _, _ in against} <= set(KNOWN_UPWARD), sorted(against)
