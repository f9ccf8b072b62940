"""`exporter.instrument()` / `exporter.uninstrument()`: patch the installed SDKs, and undo it.

An SDK is patched where the application imports it, never imported here: each SDK patch names
the modules holding its hooked classes (`targets()`); a module already imported is patched at
once, one imported later is patched right after its code ran, by a finder at the head of
`sys.meta_path` that wraps the loader of a watched module (a post-import hook, as wrapt's
`register_post_import_hook`). So `instrument()` costs a service that uses only openai nothing
for anthropic (its 3,000 modules, seconds cold), nor for the openai resources it never calls.
`importlib.reload` runs the hook again: the reloaded classes are patched too.

Import-guarded: an SDK that is not installed (or fails to import, or lacks a hook point in
some release) is skipped with a log line, never an exception, and a hook that fails while the
app imports a module never fails the import. Idempotent: a second `instrument()` patches
nothing twice. Reversible: `uninstrument()` forgets the modules still awaited and puts every
original back; a hook that someone else has wrapped since cannot be taken out from under them,
so it stays and passes through (the hooks do nothing while not instrumented).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import threading
from types import ModuleType
from typing import Any, Callable, ContextManager

from . import hooks

log = logging.getLogger("exporter.shim")

#: SDK name -> module of its patch (each has `targets()`).
SDKS = {"openai": "exporter._internal.shim.openai",
        "anthropic": "exporter._internal.shim.anthropic"}
_MARK = "__ttft_exporter_hook__"
_MISSING = object()
#: The interpreter's per-module import lock (CPython's importlib; private, so looked up with a
#: fallback that does not wait).
_module_import_lock: Callable[[str], ContextManager[Any]] = getattr(
    getattr(importlib, "_bootstrap", None), "_ModuleLockManager",
    lambda name: contextlib.nullcontext())

#: Guards _applied, _instrumented and the writes of _watched. Never held while importing, so
#: an import finishing on another thread (which takes it to patch) cannot deadlock with it.
_lock = threading.Lock()
#: (owner, attribute, original as found in owner.__dict__ or _MISSING, our replacement)
_applied: list[tuple[type, str, Any, Any]] = []
_instrumented: list[str] = []
#: Module name -> its SDK, for every module whose hooks apply once it is imported. Read without
#: the lock by the finder (under the interpreter's import lock).
_watched: dict[str, str] = {}


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
    """Patch every installed supported SDK; returns the names of the SDKs measured.

    An SDK installed but not imported yet is named too: it is patched when the application
    imports it (a hook point missing then is logged, as here)."""
    awaited = _installed()
    with _lock:
        hooks.enabled[0] = True
        _FINDER.install()
        for sdk, modules in awaited:
            _watched.update(dict.fromkeys(modules, sdk))
    for sdk, modules in awaited:
        imported = [(name, module) for name in modules
                    if (module := _imported_module(name)) is not None]
        patched = sum(_patch(sdk, name, module) for name, module in imported)
        with _lock:
            if imported and not patched:  # imported, and not one hook point found
                for name in modules:
                    _watched.pop(name, None)
            elif sdk in _watched.values() and sdk not in _instrumented:
                _instrumented.append(sdk)
    return instrumented()


def _installed() -> list[tuple[str, list[str]]]:
    """(SDK, the modules holding its hooked classes) for each installed SDK not yet measured."""
    found = []
    for sdk, patch_module in SDKS.items():
        if sdk in _instrumented:
            continue
        try:
            if importlib.util.find_spec(sdk) is None:
                continue
            found.append((sdk, list(importlib.import_module(patch_module).targets())))
        except Exception as exc:  # not installed, or an unsupported release
            log.warning("ttft-exporter: %s is not instrumented: %r", sdk, exc)
    return found


def uninstrument() -> None:
    """Forget the modules still awaited and restore every patched attribute; calls in flight
    finish and are recorded."""
    with _lock:
        hooks.enabled[0] = False
        _watched.clear()
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
    """The SDKs currently measured (or awaited: patched when the application imports them)."""
    return tuple(_instrumented)


def _imported_module(name: str) -> ModuleType | None:
    """The module if the application imported it, once its code ran; else None.

    Called once the module is watched. Holding its import lock for a moment waits for an import
    of it running on another thread (its finder may have run before ours was there); an import
    starting later finds ours. The module this thread is importing (instrument() called from its
    code) is left to its hook."""
    try:
        with _module_import_lock(name):
            module = sys.modules.get(name)
    except Exception:  # a deadlock the interpreter detected: look without waiting
        module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return None if module is None or getattr(spec, "_initializing", False) else module


def _patch(sdk: str, name: str, module: ModuleType) -> int:
    """Apply the hooks of one imported module; returns how many are in place. Never raises."""
    try:
        hooks_of = importlib.import_module(SDKS[sdk]).targets()[name]
        targets = hooks_of(module)
    except Exception as exc:
        log.warning("ttft-exporter: %s is not instrumented: %r", name, exc)
        return 0
    patched = 0
    with _lock:
        if _watched.get(name) != sdk:  # uninstrument() came first
            return 0
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
                log.warning("ttft-exporter: cannot hook %s.%s: %r", owner.__name__, attr, exc)
    return patched


class _PatchAfterImport:
    """A finder at the head of `sys.meta_path`: for a watched module it asks the finders after
    it for the spec and wraps that spec's loader; every other import it leaves at once (one
    dict lookup). Installed once and never removed (removing a finder can make an import
    running on another thread skip the next one); with nothing watched it does nothing."""

    def __init__(self) -> None:
        self.installed = False

    def install(self) -> None:
        if not self.installed:
            sys.meta_path.insert(0, self)
            self.installed = True

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _watched:
            return None
        finders = sys.meta_path
        start = next((i + 1 for i, finder in enumerate(finders) if finder is self), None)
        if start is None:
            return None
        for finder in finders[start:]:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(fullname, spec.loader)
                return spec
        return None


class _PatchingLoader:
    """Runs the module's own loader, then patches the module (its hook never raises)."""

    def __init__(self, name: str, loader: Any):
        self.name = name
        self.loader = loader

    def __getattr__(self, attr: str) -> Any:  # get_source, is_package, resources, ...
        return getattr(self.loader, attr)

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module sees its own loader, as if this one were not there.
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        self.loader.exec_module(module)
        sdk = _watched.get(self.name)
        if sdk is not None:
            _patch(sdk, self.name, module)


_FINDER = _PatchAfterImport()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at fork time


os.register_at_fork(after_in_child=_after_fork_in_child)
