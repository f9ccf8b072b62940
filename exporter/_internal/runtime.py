"""The process-wide state behind the public API, and the one place a process's role is chosen.

A process plays one of three roles, decided here and nowhere else (as prometheus_client chooses
its value class once):

* **in-process** (the default): calls are recorded here and served by this process's /metrics;
* **push worker**: a push URL is set (`push_url`, or the env var TTFT_EXPORTER_PUSH_URL), so
  the recorder is a delta store whose content a flusher thread pushes to an aggregator;
* **aggregator**: `ttft-exporter serve` (`become_aggregator()`), which merges workers' pushes
  into its recorder and never pushes itself.

`configure()` swaps config, recorder and renderer at once, so a scrape or a call in flight sees
either the old or the new state, never a mix; calls that started before the swap record into
the old recorder. Starting, following or retiring the push flusher happens after the swap,
outside the state lock, and never waits on the network (a retired flusher makes its last push
on its own thread). At exit a pushing process makes its last push; after fork() a pushing child
starts afresh (new recorder, worker id and flusher: the parent's data is the parent's to push),
and any child gets fresh locks (a lock another thread held at fork time is never released).

Only names and this module load with `import exporter`: the config's types and the recorder
are imported when the state is first built (the first call, `configure()`, or
`start_http_server()`), the renderer (and the exposition) at its first use (a scrape, the
collector, the push worker's wiring), the server by `start_http_server()`, the collector by
`collector()`, the push worker when a push URL is set, the YAML loader by `configure()` from a
file or a dict (docs/performance.md, "Start-up").
"""

from __future__ import annotations

import atexit
import enum
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, Mapping

from . import names

if TYPE_CHECKING:  # imported where first used: the caller's process loads none of it at start
    from .config.settings import Config
    from .expose.collector import ExporterCollector
    from .expose.server import ExporterServer
    from .expose.text import ExtraFamilies, Renderer
    from .fleet.push import Flusher
    from .record.recorder import Recorder

log = logging.getLogger("exporter.runtime")

#: fleet.push's ENV_URL, read here so that deciding the role imports the push worker only when
#: a push URL may be set (tests/test_startup.py holds the two equal).
_PUSH_URL_ENV = "TTFT_EXPORTER_PUSH_URL"
#: The module counting the connections this process's HTTP servers closed: once it is loaded a
#: server may have closed some, and a state's renderer is built with the state (see State).
_CLOSED_CONNECTIONS = "exporter._internal.expose.closed_connections"
#: start_http_server's defaults: the config's `server.addr` and `server.port` defaults, written
#: here so that `import exporter` builds none of the config's types (held equal by the test).
DEFAULT_ADDR, DEFAULT_PORT = "127.0.0.1", 9469


class Role(enum.Enum):
    IN_PROCESS = "in-process"
    PUSH_WORKER = "push worker"
    AGGREGATOR = "aggregator"


class State:
    """One config, its recorder and renderer, and the role the process plays under it.

    A process's renderer is built at its first use, as of the recorder's creation (expose/text.py,
    `at_birth`): a process that never serves loads none of the exposition, and a call recorded
    before the first scrape debuts and is dated as if the renderer had been there. It is built
    with the state where a later build could not start as of the recorder's creation: in the
    aggregator (its own families) and once a server of this process may have closed
    connections (their counts at the recorder's creation are not kept)."""

    __slots__ = ("config", "recorder", "role", "_renderer")

    def __init__(self, config: Config, recorder: Recorder, role: Role,
                 renderer: Renderer | None = None):
        self.config = config
        self.recorder = recorder
        self.role = role
        self._renderer = renderer

    @property
    def renderer(self) -> Renderer:
        renderer = self._renderer
        if renderer is None:
            with _building:
                renderer = self._renderer
                if renderer is None:
                    from .expose.text import Renderer

                    renderer = self._renderer = Renderer(self.recorder, at_birth=True)
        return renderer

    def reset_after_fork(self) -> None:
        self.recorder.reset_after_fork()
        if self._renderer is not None:
            self._renderer.reset_lock_after_fork()


_lock = threading.Lock()  # guards _state
_building = threading.Lock()  # one build of a state's renderer at a time
#: Guards _flusher, _retiring and _stopping; never taken by recording threads. Reentrant: the
#: SIGTERM handler of a multiprocessing child can interrupt its own thread holding it.
_wiring = threading.RLock()
_state: State | None = None
_aggregator = False
_extra: ExtraFamilies | None = None
_flusher: Flusher | None = None
_retiring: list[Flusher] = []
_stopping: list[Flusher] = []  # making their last push at exit


def _role_for(config: Config) -> Role:
    if _aggregator:
        return Role.AGGREGATOR
    return Role.PUSH_WORKER if _push_url(config) else Role.IN_PROCESS


def _push_url(config: Config) -> str:
    """fleet.push.push_url, the push worker imported only when a push URL may be set."""
    if not config.push_url and _PUSH_URL_ENV not in os.environ:
        return ""
    from .fleet.push import push_url

    return push_url(config)


def _new_state(config: Config) -> State:
    from .record.recorder import Recorder

    recorder = Recorder(config)
    renderer = None
    if _extra is not None or _CLOSED_CONNECTIONS in sys.modules:
        from .expose.text import Renderer

        renderer = Renderer(recorder, _extra)
    return State(config, recorder, _role_for(config), renderer)


def state() -> State:
    """The current state, created with the defaults on first use."""
    current = _state
    if current is None:
        from .config.settings import Config

        return _install(Config())
    return current


def configure(source: str | os.PathLike[str] | Mapping[str, Any] | Config | None = None
              ) -> Config:
    """Load and validate a config (raises ConfigError on a mistake), then use it from now on."""
    from .config.settings import Config

    if isinstance(source, Config):
        config = source
    else:
        from .config.loader import load

        config = load(source)
    _install(config, replace=True)
    return config


def become_aggregator(config: Config, recorder: Recorder, self_metrics: ExtraFamilies
                      ) -> State:
    """This process is `ttft-exporter serve`: it serves `recorder`, into which the aggregator
    merges the workers' pushes (and `self_metrics`, rendered after the recorder's families),
    and never pushes itself."""
    global _aggregator, _extra, _state
    from .expose.text import Renderer

    _aggregator, _extra = True, self_metrics
    with _lock:
        new = _state = State(config, recorder, Role.AGGREGATOR,
                             Renderer(recorder, self_metrics))
    _wire_push(new)
    return new


def _install(config: Config, replace: bool = False) -> State:
    global _state
    with _lock:
        if _state is not None and not replace:
            return _state
        new = _state = _new_state(config)
    _wire_push(new)
    return new


def _wire_push(new: State) -> None:
    """Start, follow or retire the flusher for the state just installed (no network waits)."""
    global _flusher
    url = _push_url(new.config) if new.role is Role.PUSH_WORKER else ""
    with _wiring:
        if _state is not new:  # a later configure() won the race; it wires itself
            return
        current = _flusher
        if current is not None and url and current.url == url and \
                current.config.push == new.config.push:
            current.follow(new.recorder)
            new.renderer.extra = current.families
            return
        _flusher = None
        if current is not None:
            current.retire()
            _retiring.append(current)
        if not url:
            return
        try:
            from .fleet.push import Flusher

            _flusher = Flusher(url, new.config, new.recorder).start()
            new.renderer.extra = _flusher.families  # the worker's own push counters
        except ValueError as e:
            log.warning("ttft-exporter push: %s; not pushing", e)
            return
    _last_push_in_multiprocessing_children()


def start_http_server(port: int = DEFAULT_PORT, addr: str = DEFAULT_ADDR) -> ExporterServer:
    """Serve the process-wide metrics on addr:port from a daemon thread; returns the server.

    Raises OSError naming the address when it cannot listen (the port is taken, say): the app
    decides whether to go on without /metrics."""
    from .expose.server import ExporterServer, create_app

    return ExporterServer(create_app(_renderer), addr, port,
                          config=state().config.server).start()


def collector() -> ExporterCollector:
    """A prometheus_client collector of the process-wide state current at each scrape."""
    from .expose.collector import ExporterCollector

    return ExporterCollector(_renderer)


def _renderer() -> Renderer:
    return state().renderer


def count_drop(reason: str = names.DROP_INTERNAL) -> None:
    """One internal failure outside any call (a hook, a middleware): counted, never raised."""
    try:
        state().recorder.count_drop(reason)
    except Exception:  # pragma: no cover - the state itself cannot be built
        pass


def current_flusher() -> Flusher | None:
    """The running flusher, if this process is a push worker (tests, diagnostics)."""
    return _flusher


def stop_pushing(timeout: float | None = None) -> None:
    """Make the last push and wait for it (at exit): every flusher, retiring ones included.

    Called again while a first call waits (SIGTERM arriving during the exit hooks), it waits
    for the same last pushes rather than letting the process die under them."""
    global _flusher
    with _wiring:
        if _flusher is not None:
            _stopping.append(_flusher)
        _stopping.extend(_retiring)
        _flusher = None
        _retiring.clear()
        flushers = list(_stopping)
    for flusher in flushers:
        try:
            flusher.close(timeout)
        except Exception:
            log.exception("ttft-exporter push: final push failed")
    with _wiring:
        for flusher in flushers:
            if flusher in _stopping:
                _stopping.remove(flusher)


_finalizer_pid = 0


class _ForkToken:
    """Kept alive for multiprocessing's after-fork registry (it holds its keys weakly)."""


_FORK_TOKEN = _ForkToken()


def _last_push_in_multiprocessing_children() -> None:
    """multiprocessing children leave through os._exit, so atexit never runs there: the last
    push is also registered with multiprocessing's exit hook, which a child's bootstrap runs,
    and, in a child, with SIGTERM (`Process.terminate()`, and `Pool` on leaving its `with`).

    The bootstrap of a forked child first empties the finalizers it inherited, then runs the
    after-fork callbacks: the hooks are registered again from one of those."""
    global _finalizer_pid
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is None:
        return
    if _finalizer_pid != os.getpid():
        _finalizer_pid = os.getpid()
        mp_util.Finalize(None, stop_pushing, exitpriority=100)
        _last_push_on_sigterm()
    mp_util.register_after_fork(_FORK_TOKEN, _register_again_in_child)


def _register_again_in_child(_token: _ForkToken) -> None:
    global _finalizer_pid
    if _flusher is not None:
        _finalizer_pid = 0
        _last_push_in_multiprocessing_children()


def _last_push_on_sigterm() -> None:
    """In a multiprocessing child that left SIGTERM at its default (killed at once), make the
    last push first, then die of SIGTERM as before. Nothing changes for a process that handles
    SIGTERM itself, or for the main process."""
    process = sys.modules.get("multiprocessing.process")
    if process is None or process.parent_process() is None or \
            threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def last_push_then_terminate(signum: int, frame: object) -> None:
        try:
            stopping = list(_stopping)  # (read without a lock: it may be held right here)
            if stopping:  # the exit hooks, interrupted, are making the last push: wait for it
                for flusher in stopping:
                    flusher.wait_closed()
            else:
                stop_pushing()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, last_push_then_terminate)


def _after_fork_in_child() -> None:
    global _lock, _building, _wiring, _flusher
    _lock, _building, _wiring = threading.Lock(), threading.Lock(), threading.RLock()
    current = _state
    if current is None:
        return
    current.reset_after_fork()
    inherited, _flusher = _flusher, None
    for flusher in (*_retiring, *_stopping):
        flusher.abandon()
    _retiring.clear()
    _stopping.clear()
    if inherited is None:
        return
    inherited.abandon()
    try:
        _install(current.config, replace=True)  # a fresh recorder, and a flusher for it
    except Exception:
        log.exception("ttft-exporter push: could not restart after fork")


atexit.register(stop_pushing)
os.register_at_fork(after_in_child=_after_fork_in_child)
