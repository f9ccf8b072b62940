"""`python -m bench [--quick] [--out FILE]`: run every benchmark, write docs/benchmarks.md."""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

#: (module, title): each module has `run(quick: bool) -> list[str]` returning markdown lines.
SECTIONS = [
    ("bench.core", "Recorder, memory and scrape (issue #2)"),
    ("bench.accuracy", "Accuracy of the quantiles"),
    ("bench.shim_overhead", "SDK patch overhead (issue #3) and tracing (issue #6)"),
    ("bench.push", "Multi-process push and aggregator (issue #5)"),
    ("bench.native", "Native histograms over protobuf (issue #13)"),
    ("bench.tasks", "Agent tasks: tool, guardrail and task cost (issue #15)"),
]


def machine() -> list[str]:
    def v(name: str) -> str:
        try:
            return version(name)
        except Exception:
            return "not installed"

    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "unknown"
    import os

    return [f"- machine: {cpu}, {os.cpu_count()} cores, {platform.system()} "
            f"{platform.release()}",
            f"- Python {platform.python_version()}; prometheus_client {v('prometheus-client')}, "
            f"hdrhistogram {v('hdrhistogram')}, opentelemetry-sdk {v('opentelemetry-sdk')}, "
            f"openai {v('openai')}, anthropic {v('anthropic')}",
            f"- date: {time.strftime('%Y-%m-%d')}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--out", default="docs/benchmarks.md", help="'-' for stdout")
    args = parser.parse_args(argv)
    lines = ["# Benchmarks", "",
             "Written by `make bench` (`python -m bench`); do not edit by hand. Every speed is "
             "measured side by side in one process: contenders interleaved, each run timing all "
             "of them, ratios taken run by run; the table gives the median and the min and max "
             "over the runs.", "", *machine(), ""]
    for module, title in SECTIONS:
        started = time.perf_counter()
        print(f"bench: {title} ...", file=sys.stderr, flush=True)
        section = importlib.import_module(module).run(args.quick)
        lines += [f"## {title}", "", *section, "",
                  f"_({time.perf_counter() - started:.0f} s)_", ""]
    text = "\n".join(lines)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
        print(f"bench: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
