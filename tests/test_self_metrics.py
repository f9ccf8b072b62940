"""The exporter's own families are declared once (expose/self_metrics.TABLE) and each server
serves exactly those it is declared to serve, with the declared type, help and labels: the
in-process exposition, a push worker's, the aggregator's and the watch's."""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter._internal import names
from exporter._internal.config.settings import AlertingConfig, Config
from exporter._internal.diagnose.watch import Watch, Windows
from exporter._internal.expose import self_metrics
from exporter._internal.expose.self_metrics import AGGREGATOR, STORE, TABLE, WATCH, WORKER
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.push import Flusher
from exporter._internal.record.recorder import Recorder

EXPORTER = Path(__file__).resolve().parent.parent / "exporter"
#: A name of the exporter's own (not preceded by a word character, not a `_*` glob).
OWN_NAME = re.compile(r"\bttft_exporter_[a-z_]+\b(?!\*)")
#: Calls whose first argument names a Python object, not a metric (context variables, an
#: aiohttp request key).
OBJECT_NAMERS = {"ContextVar", "RequestKey"}


def names_in_code() -> set[str]:
    """Every `ttft_exporter_` name the package spells in a string (docstrings included)."""
    found: set[str] = set()
    for path in EXPORTER.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = {id(node.args[0]) for node in ast.walk(tree) if isinstance(node, ast.Call)
                   and node.args and ast.unparse(node.func).split(".")[-1] in OBJECT_NAMERS}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    id(node) not in skipped:
                found.update(OWN_NAME.findall(node.value))
    return found


def test_every_own_name_in_the_code_is_declared_in_the_table_once():
    declared = collections.Counter(m.name for m in TABLE)
    assert [name for name, n in declared.items() if n > 1] == []
    assert sorted(names_in_code() - set(declared)) == []
    # the table holds the store's own counter rows as names.COUNTERS declares them
    own_counters = {c.name: c for c in names.COUNTERS if c.name.startswith("ttft_exporter_")}
    assert {m.name for m in self_metrics.STORE_COUNTERS} == set(own_counters)


def served(text: str) -> dict[str, tuple[str, str, set[tuple[str, ...]]]]:
    """The exporter's own families in an exposition: name -> (type, help, label names of each
    sample)."""
    table_names = {m.name for m in TABLE}
    out = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        if name.startswith("ttft_exporter_") or name in table_names:
            out[name] = (fam.type, fam.documentation,
                         {tuple(sorted(s.labels)) for s in fam.samples})
    return out


def assert_serves_as_declared(text: str, servers: set[str]) -> None:
    families = served(text)
    expected = [m for m in TABLE if servers & set(m.served_by)]
    assert sorted(families) == sorted(m.name for m in expected)
    for metric in expected:
        kind, help_text, label_sets = families[metric.name]
        assert (kind, help_text) == (metric.kind, metric.help), metric.name
        assert label_sets <= {metric.labels}, metric.name


def test_the_in_process_exposition_serves_the_store_families_as_declared():
    rec = Recorder()
    rec.locked(rec.add_row, names.TENANT_FOLDS, ("m", "r"), 1)
    assert_serves_as_declared(Renderer(rec).render().decode(), {STORE})


def test_a_push_worker_serves_its_own_push_counters_as_declared():
    rec = Recorder()
    flusher = Flusher("http://127.0.0.1:9/", Config(), rec)  # never started: nothing sent
    assert_serves_as_declared(Renderer(rec, flusher.families).render().decode(),
                              {STORE, WORKER})


def test_the_aggregator_serves_its_families_as_declared():
    rec = Recorder()
    aggregator = Aggregator(Config(), rec)  # no snapshot path: no file, no thread
    try:
        text = Renderer(rec, aggregator.families).render().decode()
    finally:
        aggregator.close()
    assert_serves_as_declared(text, {STORE, AGGREGATOR})


def test_the_watch_serves_its_families_as_declared():
    watch = Watch(None, Windows.of(AlertingConfig()))
    assert_serves_as_declared(watch.render(), {WATCH})
