"""instrument()/uninstrument(): idempotent, reversible, import-guarded, never raising; the
supported SDK versions."""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import anthropic
import openai
import pytest

import exporter
from exporter._internal import names, runtime
from exporter._internal.shim import (anthropic as shim_anthropic, httpx_trace,
                                     instrument as instrument_module, openai as shim_openai)
from tests import test_shim_support as support
from tests.test_shim_support import Recorded, drops, script

# Shared fixtures of tests/test_shim_support.py.
server = support.server

MESSAGES = [{"role": "user", "content": "hi"}]


def hooks_of(patch) -> list[tuple[type, str, object]]:
    """Every hook of an SDK patch, its modules imported."""
    return [hook for name, hooks_in in patch.targets().items()
            for hook in hooks_in(importlib.import_module(name))]


def hook_points():
    return [(owner, attr) for patch in (shim_openai, shim_anthropic)
            for owner, attr, _ in hooks_of(patch)]


def snapshot():
    return {(owner, attr): owner.__dict__.get(attr) for owner, attr in hook_points()}


def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0)


def stream_call(c, **s):
    for _ in c.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                       extra_headers=script(**s)):
        pass


def test_instrument_is_idempotent_and_uninstrument_restores_the_originals(server):
    before = snapshot()
    assert exporter.instrument() == ("openai", "anthropic")
    once = snapshot()
    assert exporter.instrument() == ("openai", "anthropic")
    assert snapshot() == once  # nothing wrapped twice
    assert all(once[k] is not before[k] for k in before)
    assert openai.Stream.__dict__["__stream__"].__wrapped__ is before[(openai.Stream,
                                                                       "__stream__")]
    exporter.uninstrument()
    assert all(after is before[k] for k, after in snapshot().items())
    exporter.uninstrument()  # twice is fine
    rec = Recorded()
    stream_call(client(server), tokens=2)
    assert rec.all() == []  # not measured any more


def test_clients_created_before_instrument_are_measured(server):
    c = client(server)
    a = anthropic.Anthropic(base_url=server.base_url, api_key="test", max_retries=0)
    raw = c.chat.completions.with_raw_response  # cached before instrument()
    exporter.instrument()
    try:
        rec = Recorded()
        stream_call(c, tokens=2)
        a.messages.create(model="claude", max_tokens=5, messages=MESSAGES)
        raw.create(model="m", messages=MESSAGES).parse()
        assert [t.outcome for t in rec.all()] == [names.OK] * 3
    finally:
        exporter.uninstrument()


def test_a_later_patch_on_top_is_left_alone(server):
    from openai.resources.chat.completions.completions import Completions

    original = Completions.__dict__["create"]
    exporter.instrument()
    ours = Completions.__dict__["create"]

    @functools.wraps(ours)
    def theirs(*args, **kwargs):
        return ours(*args, **kwargs)

    Completions.create = theirs
    try:
        exporter.uninstrument()
        assert Completions.__dict__["create"] is theirs  # not taken from under them
        rec = Recorded()
        stream_call(client(server), tokens=2)
        assert rec.all() == []
        exporter.instrument()  # ours is still inside theirs: not wrapped a second time
        assert Completions.__dict__["create"] is theirs
        stream_call(client(server), tokens=2)
        assert len(rec.all()) == 1
    finally:
        exporter.uninstrument()
        Completions.create = original


def test_import_guarded(monkeypatch, caplog):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "anthropic" else real(name, *a))

    def broken():
        raise ImportError("no such hook in this release")

    monkeypatch.setattr(shim_openai, "targets", broken)
    try:
        assert exporter.instrument() == ()
        assert "openai is not instrumented" in caplog.text
    finally:
        exporter.uninstrument()


def test_internal_failures_are_counted_drops_never_raised(server, monkeypatch):
    exporter.instrument()
    try:
        rec = Recorded()

        def bad_classify(chunk, tr):
            raise RuntimeError("classifier bug")

        endpoint = shim_openai.ENDPOINTS["/chat/completions"]
        monkeypatch.setattr(endpoint, "classify", bad_classify)
        c = client(server)
        chunks = list(c.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                                extra_headers=script(tokens=4)))
        assert len(chunks) == 6  # the stream is untouched
        assert drops() == 1 and rec.one().outcome == names.OK
        monkeypatch.undo()

        def bad_headers(t, now, info):
            raise RuntimeError("trace bug")

        monkeypatch.setattr(httpx_trace, "note_headers", bad_headers)
        assert c.chat.completions.create(model="m", messages=MESSAGES).choices
        assert drops() > 1 and rec.one().outcome == names.OK
    finally:
        exporter.uninstrument()


def test_abandoned_inside_the_recorders_lock_is_deferred_not_deadlocked(server):
    exporter.instrument()
    try:
        rec = Recorded()
        c = client(server)
        s = c.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                      extra_headers=script(tokens=4))
        next(s)
        recorder = runtime.state().recorder
        with recorder.held:  # as if the collector ran a finaliser while this thread records
            del s
            gc.collect()
            assert len(recorder._deferred) == 1 and not recorder.rows[names.REQUESTS_TOTAL]
        # the lock's release recorded it: no other call was needed (a scrape would do too)
        assert recorder.counts().rows[names.REQUESTS_TOTAL] == {
            ("m", names.ABANDONED, "local", names.UNKNOWN, names.UNKNOWN): 1}
        stream_call(c, tokens=1)
        abandoned, ok = rec.all()
        assert (abandoned.outcome, ok.outcome) == (names.ABANDONED, names.OK)
    finally:
        exporter.uninstrument()


def _declared(extra: str, package: str) -> tuple[str, str]:
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    spec = next(s for s in pyproject["project"]["optional-dependencies"][extra]
                if s.startswith(package))
    low = re.search(r">=([\d.]+)", spec).group(1)
    high = re.search(r"<([\d.]+)", spec).group(1)
    return low, high


def _tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:3])


@pytest.mark.parametrize("package", ["openai", "anthropic"])
def test_installed_sdk_is_a_declared_version_and_every_hook_point_exists(package):
    """Runs against whatever is installed. The oldest declared releases (openai 3.50.0,
    anthropic 2.10.0) were checked by running tests/test_shim_*.py in a scratch venv (see
    docs/decisions.md); CI runs the newest allowed by pyproject."""
    low, high = _declared("sdks", package)
    installed = version(package)
    assert _tuple(low) <= _tuple(installed) < _tuple(high), (package, installed, low, high)
    module = {"openai": shim_openai, "anthropic": shim_anthropic}[package]
    for owner, attr, _ in hooks_of(module):
        assert callable(getattr(owner, attr)), (owner, attr)
    assert instrument_module.SDKS[package] == module.__name__
