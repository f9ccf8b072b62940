"""The process-wide state behind the public API: one config, one recorder, one renderer.

`configure()` swaps all three at once, so a scrape or a call in flight sees either the old or
the new state, never a mix; calls that started before the swap record into the old recorder.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from . import config as config_module
from .config import Config
from .exposition import Renderer
from .recorder import Recorder


@dataclass(frozen=True)
class State:
    config: Config
    recorder: Recorder
    renderer: Renderer


def _new_state(config: Config) -> State:
    recorder = Recorder(config)
    return State(config, recorder, Renderer(recorder))


_lock = threading.Lock()
_state: State | None = None


def state() -> State:
    """The current state, created with the defaults on first use."""
    global _state
    current = _state
    if current is None:
        with _lock:
            if _state is None:
                _state = _new_state(Config())
            current = _state
    return current


def _fresh_locks_after_fork() -> None:
    """In a forked child only the forking thread survives: a lock another thread held at fork
    time would never be released. The child keeps the data (as prometheus_client does) with new
    locks; push mode additionally starts the child afresh (push.py)."""
    global _lock
    _lock = threading.Lock()
    current = _state
    if current is not None:
        current.recorder._lock = threading.Lock()
        current.renderer._lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks_after_fork)


def configure(source: str | os.PathLike[str] | Mapping[str, Any] | Config | None = None
              ) -> Config:
    """Load and validate a config (raises ConfigError on a mistake), then use it from now on."""
    config = source if isinstance(source, Config) else config_module.load(source)
    global _state
    with _lock:
        _state = _new_state(config)
    return config
