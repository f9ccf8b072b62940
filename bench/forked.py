"""The smoke run's fresh processes: each case in a process of its own, forked from a server
that imported the SDKs and the exporter once.

A full run measures each case in a fresh interpreter (bench.call_table, bench.call_instructions:
no case inherits another's patches, providers or heap). The suite's smoke run
(`python -m bench --quick`, tests/test_bench_smoke.py) only proves every case still runs, and a
fresh interpreter's imports (openai, anthropic, the OpenTelemetry SDK: ~3 s of CPU) cost ~100
times its few calls: a fork of a process that imported them and ran nothing keeps the
isolation without them.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from typing import Any

#: What every case imports: the forkserver imports it once.
PRELOAD = ["bench.shim_overhead", "bench.traced_instructions", "exporter", "openai",
           "anthropic", "opentelemetry.sdk.trace"]


def each_in_a_fork(fn: Callable[..., Any], calls: Iterable[tuple[Any, ...]]) -> list[Any]:
    """`fn(*args)` for each `args`, each in a new process (two at a time on two cores), in
    order; `fn` must be a module's top-level function."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    with context.Pool(os.cpu_count() or 1, maxtasksperchild=1) as pool:
        return pool.starmap(fn, list(calls))
