"""Start-up (issue #33): what `import exporter; exporter.instrument()` adds to a service that
imports the openai SDK only, and what its first call pays for what loads lazily.

`python -m bench.startup [--quick] [--runs N]` prints a markdown section; `run(quick)` returns it
for `python -m bench`. Every figure comes from fresh interpreters run in turn, A B A B ...
(the order flipped every other round): A is `import openai`, B is `import openai; import
exporter; exporter.instrument()`. Each pair runs twice: with anthropic installed (this venv) and
without it (a scratch venv linking every package of this one but anthropic). The bytecode is
cached (a pycache prefix, warmed by one run of each command) as in an installed service.

Three figures per pair: the whole process's wall time measured from outside (what a worker's
start-up pays, interpreter start included; B minus A of the same round), and, inside B, the
wall and CPU time of `import exporter; exporter.instrument()` alone (steadier on a busy
machine). Then the modules B adds after `import openai` (`sys.modules` before and after).
Last, the first two calls of a client against the demo provider (a 4-chunk stream, no
scripted wait) in fresh interpreters with and without the exporter: the first call pays what
loads lazily (the exporter's state, the recorder, the renderer; the SDK's own resources).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import venv
from collections import Counter
from pathlib import Path
from typing import Any

from exporter._internal.demo.provider import SCRIPT_HEADER, ProviderServer

#: The child: imports openai, then (unless told `openai`) the exporter, and reports its times
#: and modules as one JSON line; with a base URL it also times its first two calls.
CHILD = r"""
import sys, time
import openai
wall, cpu = time.perf_counter(), time.process_time()
before = set(sys.modules)
if sys.argv[1] == "exporter":
    import exporter
    exporter.instrument()
out = {"wall_ms": (time.perf_counter() - wall) * 1e3, "cpu_ms": (time.process_time() - cpu) * 1e3,
       "added": sorted(set(sys.modules) - before)}
if len(sys.argv) > 2:
    client = openai.OpenAI(base_url=sys.argv[2], api_key="bench", max_retries=0)
    def call():
        for _ in client.chat.completions.create(
                model="bench", messages=[{"role": "user", "content": "hi"}], stream=True,
                extra_headers={sys.argv[3]: '{"tokens": 4}'}):
            pass
    for n in ("first", "second"):
        before = set(sys.modules)
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        out[n + "_ms"] = (time.perf_counter() - wall) * 1e3
        out[n + "_cpu_ms"] = (time.process_time() - cpu) * 1e3
        out[n + "_loaded"] = sorted(set(sys.modules) - before)
import json
print(json.dumps(out))
"""

#: What a service may never find loaded by `import exporter; exporter.instrument()`.
SERVER_SIDE = ("anthropic", "aiohttp", "opentelemetry", "prometheus_client", "yaml",
               "exporter._internal.expose", "exporter._internal.fleet")


def venv_without(package: str, root: Path) -> Path:
    """A venv whose site-packages links every entry of this one's but `package`'s (its module
    and its dist-info): the same installs, `package` not installed. Returns its python."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    here = {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    there = {Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})[key])
             for key in ("purelib", "platlib")}
    for site, target in zip(sorted(here), sorted(there)):
        for entry in site.iterdir():
            if entry.name == package or (entry.name.startswith(package + "-")
                                         and entry.name.endswith(".dist-info")):
                continue
            if not (target / entry.name).exists():
                (target / entry.name).symlink_to(entry)
    python = root / "bin" / "python"
    found = subprocess.run([str(python), "-c", f"import importlib.util as u; "
                            f"print(u.find_spec({package!r}) is None)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if found != "True":
        raise RuntimeError(f"{package} is still importable in the scratch venv {root}")
    return python


def child(python: Path, mode: str, env: dict[str, str], base_url: str = "") -> dict[str, Any]:
    """One fresh interpreter; its report, with the process's wall time measured from here."""
    args = [str(python), "-c", CHILD, mode] + ([base_url, SCRIPT_HEADER] if base_url else [])
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    process_ms = (time.perf_counter() - started) * 1e3
    if done.returncode != 0:
        raise RuntimeError(f"{mode} child failed: {done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["process_ms"] = process_ms
    return report


def pairs(python: Path, env: dict[str, str], runs: int, base_url: str = ""
          ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """`runs` rounds of (openai alone, openai + exporter), in turn, the order flipped every
    other round; one unmeasured round first (it writes the bytecode cache)."""
    child(python, "openai", env, base_url)
    child(python, "exporter", env, base_url)
    out = []
    for n in range(runs):
        if n % 2:
            b = child(python, "exporter", env, base_url)
            a = child(python, "openai", env, base_url)
        else:
            a = child(python, "openai", env, base_url)
            b = child(python, "exporter", env, base_url)
        out.append((a, b))
    return out


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} (min {min(values):.1f})"


def _groups(modules: list[str]) -> str:
    """Module names grouped by package (exporter's by stage), most first."""
    def group(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:3]) if parts[0] == "exporter" and len(parts) > 2 \
            and parts[1] == "_internal" else parts[0]

    counts = Counter(group(name) for name in modules)
    return ", ".join(f"`{name}` {n}" for name, n in counts.most_common())


def startup_rows(rounds: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]) -> list[str]:
    lines = ["| anthropic | `import openai`, process ms | + `import exporter; "
             "exporter.instrument()`, process ms | added, process ms (B − A per round) | "
             "added inside B, wall ms | added inside B, CPU ms | modules added |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for where, pairs_ in rounds.items():
        a = [p[0]["process_ms"] for p in pairs_]
        b = [p[1]["process_ms"] for p in pairs_]
        lines.append(
            f"| {where} | {_ms(a)} | {_ms(b)} | {_ms([y - x for x, y in zip(a, b)])} | "
            f"{_ms([p[1]['wall_ms'] for p in pairs_])} | "
            f"{_ms([p[1]['cpu_ms'] for p in pairs_])} | {len(pairs_[-1][1]['added'])} |")
    return lines


def first_call_rows(pairs_: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    lines = ["| | first call, wall ms | first call, CPU ms | second call, wall ms | "
             "modules the first call loads |", "| --- | --- | --- | --- | --- |"]
    for label, side in (("openai alone", 0), ("openai + exporter", 1)):
        loaded = pairs_[-1][side]["first_loaded"]
        lines.append(f"| {label} | {_ms([p[side]['first_ms'] for p in pairs_])} | "
                     f"{_ms([p[side]['first_cpu_ms'] for p in pairs_])} | "
                     f"{_ms([p[side]['second_ms'] for p in pairs_])} | {len(loaded)} |")
    added = [b["first_ms"] - a["first_ms"] for a, b in pairs_]
    added_cpu = [b["first_cpu_ms"] - a["first_cpu_ms"] for a, b in pairs_]
    lines.append(f"| added by the exporter (per round) | {_ms(added)} | {_ms(added_cpu)} | "
                 f"{_ms([b['second_ms'] - a['second_ms'] for a, b in pairs_])} | |")
    return lines


def run(quick: bool = False, runs: int | None = None) -> list[str]:
    runs = runs or (1 if quick else 21)
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        env = {key: value for key, value in os.environ.items()
               if key != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        interpreters = {"installed": Path(sys.executable),
                        "not installed": venv_without("anthropic", Path(tmp) / "venv")}
        rounds = {where: pairs(python, env, runs) for where, python in interpreters.items()}
        with ProviderServer() as provider:
            calls = pairs(Path(sys.executable), env, runs, provider.base_url + "/v1")
    added = rounds["installed"][-1][1]["added"]
    leaked = [name for name in added if name.startswith(SERVER_SIDE)]
    exporter_first = calls[-1][1]["first_loaded"]
    sdk_first = set(calls[-1][0]["first_loaded"])
    try:
        load = f" Load average when the run ended: {os.getloadavg()[0]:.1f} on " \
               f"{os.cpu_count()} cores."
    except OSError:
        load = ""
    return [
        f"{runs} rounds per row, each a fresh interpreter per command (A B, then B A), the "
        f"bytecode cached; median (min) in ms.{load}", "",
        *startup_rows(rounds), "",
        f"Modules `import exporter; exporter.instrument()` adds after `import openai`: "
        f"{_groups(added)}; of the server side ({', '.join(SERVER_SIDE)}): "
        f"{_groups(leaked) or 'none'}.", "",
        "The first two calls of a client (a 4-chunk stream from the demo provider), in fresh "
        "interpreters:", "",
        *first_call_rows(calls), "",
        f"What the first call loads beyond the SDK's own resources, with the exporter: "
        f"{_groups([m for m in exporter_first if m not in sdk_first]) or 'nothing'}.",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup")
    parser.add_argument("--quick", action="store_true", help="one round (smoke test)")
    parser.add_argument("--runs", type=int, help="rounds per row (default 21)")
    args = parser.parse_args(argv)
    print("\n".join(run(args.quick, args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
