"""`exporter.instrument()` / `exporter.uninstrument()`: patch the installed SDKs, and undo it.

Import-guarded: an SDK that is not installed (or fails to import, or lacks a hook point in
some release) is skipped with a log line, never an exception. Idempotent: a second
`instrument()` patches nothing twice. Reversible: `uninstrument()` puts every original back;
a hook that someone else has wrapped since cannot be taken out from under them, so it stays
and passes through (the hooks do nothing while not instrumented).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from typing import Any

from . import hooks

log = logging.getLogger("exporter.shim")

#: SDK name -> module of its patch (each has `targets()`).
SDKS = {"openai": "exporter._internal.shim.openai",
        "anthropic": "exporter._internal.shim.anthropic"}
_MARK = "__ttft_exporter_hook__"
_MISSING = object()

_lock = threading.Lock()
#: (owner, attribute, original as found in owner.__dict__ or _MISSING, our replacement)
_applied: list[tuple[type, str, Any, Any]] = []
_instrumented: list[str] = []


def _ours(fn: Any) -> bool:
    """True when `fn` is one of our hooks, or wraps one (functools.wraps chains)."""
    for _ in range(32):
        if fn is None:
            return False
        if getattr(fn, _MARK, False):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def instrument() -> tuple[str, ...]:
    """Patch every installed supported SDK; returns the names of the SDKs measured."""
    with _lock:
        for sdk, module_name in SDKS.items():
            if sdk in _instrumented:
                continue
            try:
                if importlib.util.find_spec(sdk) is None:
                    continue
                targets = importlib.import_module(module_name).targets()
            except Exception as exc:  # not installed, or an unsupported release
                log.warning("ttft-exporter: %s is not instrumented: %r", sdk, exc)
                continue
            patched = 0
            for owner, attr, make in targets:
                try:
                    current = getattr(owner, attr)
                    if _ours(current):
                        patched += 1
                        continue
                    replacement = make(current)
                    setattr(replacement, _MARK, True)
                    own = owner.__dict__.get(attr, _MISSING)
                    setattr(owner, attr, replacement)
                    _applied.append((owner, attr, own, replacement))
                    patched += 1
                except Exception as exc:
                    log.warning("ttft-exporter: cannot hook %s.%s: %r", owner.__name__, attr,
                                exc)
            if patched:
                _instrumented.append(sdk)
        hooks.enabled[0] = True
        return tuple(_instrumented)


def uninstrument() -> None:
    """Restore every patched attribute; calls in flight finish and are recorded."""
    with _lock:
        hooks.enabled[0] = False
        while _applied:
            owner, attr, own, replacement = _applied.pop()
            try:
                if owner.__dict__.get(attr) is not replacement:
                    log.warning("ttft-exporter: %s.%s was re-patched by someone else; our "
                                "hook stays and passes through", owner.__name__, attr)
                    continue
                if own is _MISSING:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, own)
            except Exception as exc:
                log.warning("ttft-exporter: cannot restore %s.%s: %r", owner.__name__, attr,
                            exc)
        _instrumented.clear()


def instrumented() -> tuple[str, ...]:
    """The SDKs currently measured."""
    return tuple(_instrumented)
