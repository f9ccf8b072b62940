"""`python -m bench [--quick] [--out FILE] [--only MODULE]`: run every benchmark, write
docs/benchmarks.md; with `--only bench.tasks` (say), run that one and replace its section of
the file, keeping the others as they were measured."""

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
    ("bench.call_table", "Added per call, warm and cold, beside OpenLLMetry (issue #23)"),
    ("bench.call_instructions", "Where a call's added instructions go (issue #23)"),
    ("bench.push", "Multi-process push and aggregator (issue #5)"),
    ("bench.push_memory", "The largest push: its size and what parsing it holds (issue 31)"),
    ("bench.native", "Native histograms over protobuf (issue #13)"),
    ("bench.diagnose", "diagnose on the incident day (issue #14)"),
    ("bench.cause_cost", "Cause decision: Prometheus cost"),
    ("bench.tasks", "Agent tasks: tool, guardrail and task cost (issue #15)"),
    ("bench.startup", "Start-up: `import exporter; exporter.instrument()` (issue #33)"),
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
    parser.add_argument("--only", choices=[module for module, _ in SECTIONS],
                        help="run one section and replace it in --out")
    args = parser.parse_args(argv)
    if args.only:
        return _only(args.only, args.quick, Path(args.out))
    lines = ["# Benchmarks", "",
             "Written by `make bench` (`python -m bench`); do not edit by hand. Every speed is "
             "measured side by side in one process: contenders interleaved, each run timing all "
             "of them, ratios taken run by run; the table gives the median and the min and max "
             "over the runs.", "", *machine(), ""]
    for module, title in SECTIONS:
        lines += _section(module, title, args.quick)
    text = "\n".join(lines)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
        print(f"bench: wrote {args.out}", file=sys.stderr)
    return 0


def _section(module: str, title: str, quick: bool) -> list[str]:
    started = time.perf_counter()
    print(f"bench: {title} ...", file=sys.stderr, flush=True)
    section = importlib.import_module(module).run(quick)
    return [f"## {title}", "", *section, "", f"_({time.perf_counter() - started:.0f} s)_", ""]


def _only(module: str, quick: bool, out: Path) -> int:
    """Run one section; replace it in `out` (or insert it in SECTIONS order)."""
    titles = dict(SECTIONS)
    lines = _section(module, titles[module], quick)
    text = out.read_text() if out.exists() else ""
    parts = text.split("\n## ")  # parts[0]: the header; then one part per section
    head, sections = parts[0], {p.split("\n", 1)[0]: "## " + p for p in parts[1:]}
    sections[titles[module]] = "\n".join(lines)
    order = [t for _, t in SECTIONS if t in sections] + [t for t in sections
                                                          if t not in titles.values()]
    out.write_text("\n".join([head.rstrip("\n") + "\n",
                              *(sections[t].rstrip("\n") + "\n" for t in order)]))
    print(f"bench: replaced {titles[module]!r} in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
