"""Start-up (issue #33): what `import exporter; exporter.instrument()` adds to a service that
imports the openai SDK only, and what its first call pays for what loads lazily.

`python -m bench.startup [--quick] [--runs N] [--baseline DIR]` prints a markdown section;
`run(quick)` returns it for `python -m bench`. Every figure comes from fresh interpreters run in
turn, A B B A A B ... (the order reversed every other round): A is `import openai`, B is
`import openai; import exporter; exporter.instrument()`. Each pair runs twice: with anthropic
installed (this venv) and without it (a scratch venv linking every package of this one but
anthropic). The bytecode is cached (a pycache prefix, warmed by one run of each command) as in
an installed service.

Three figures per pair: the whole process's wall time measured from outside (what a worker's
start-up pays, interpreter start included; B minus A of the same round), and, inside B, the
wall and CPU time of `import exporter; exporter.instrument()` alone (steadier on a busy
machine). Then the modules B adds after `import openai` (`sys.modules` before and after).
Last, the first two calls of a client against the demo provider (a 4-chunk stream, no
scripted wait) in fresh interpreters with and without the exporter: the first call pays what
loads lazily (the exporter's state and recorder; the SDK's own resources). `--baseline DIR`
(a checkout of another version, e.g. `git worktree add /tmp/base main`, its C parts built or
not) adds a third interpreter per round running that version's exporter, in the same rotation:
before and after a change, side by side.
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


#: This checkout: a child run from here imports its exporter (the script's directory, '', is
#: first on the path), one run from a --baseline directory that one's.
ROOT = Path(__file__).resolve().parent.parent


def child(python: Path, mode: str, env: dict[str, str], base_url: str = "",
          cwd: Path = ROOT) -> dict[str, Any]:
    """One fresh interpreter; its report, with the process's wall time measured from here."""
    args = [str(python), "-c", CHILD, mode] + ([base_url, SCRIPT_HEADER] if base_url else [])
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, cwd=cwd)
    process_ms = (time.perf_counter() - started) * 1e3
    if done.returncode != 0:
        raise RuntimeError(f"{mode} child failed: {done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["process_ms"] = process_ms
    return report


#: A contender: the child's mode, and the checkout it runs from.
Side = tuple[str, Path]
#: openai alone, then openai + this checkout's exporter.
PAIR: list[Side] = [("openai", ROOT), ("exporter", ROOT)]


def pairs(python: Path, env: dict[str, str], runs: int, base_url: str = "",
          sides: list[Side] = PAIR) -> list[tuple[dict[str, Any], ...]]:
    """`runs` rounds of the sides (openai alone, openai + exporter, ...), in turn, the order
    reversed every other round; one unmeasured round first (it writes the bytecode cache)."""
    for mode, cwd in sides:
        child(python, mode, env, base_url, cwd)
    out = []
    for n in range(runs):
        order = list(range(len(sides)))[::-1 if n % 2 else 1]
        reports: dict[int, dict[str, Any]] = {}
        for i in order:
            mode, cwd = sides[i]
            reports[i] = child(python, mode, env, base_url, cwd)
        out.append(tuple(reports[i] for i in range(len(sides))))
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


def first_call_rows(rounds: list[tuple[dict[str, Any], ...]], labels: list[str]
                    ) -> list[str]:
    """A row per side (`labels[0]`: openai alone), then what each exporter side added to it,
    round by round."""
    keys = ("first_ms", "first_cpu_ms", "second_ms", "second_cpu_ms")
    lines = ["| | first call, wall ms | first call, CPU ms | second call, wall ms | "
             "second call, CPU ms | modules the first call loads |",
             "| --- | --- | --- | --- | --- | --- |"]
    for side, label in enumerate(labels):
        cells = " | ".join(_ms([r[side][key] for r in rounds]) for key in keys)
        lines.append(f"| {label} | {cells} | {len(rounds[-1][side]['first_loaded'])} |")
    for side, label in enumerate(labels[1:], 1):
        cells = " | ".join(_ms([r[side][key] - r[0][key] for r in rounds]) for key in keys)
        lines.append(f"| added by {label.removeprefix('openai + ')} (per round) | {cells} | |")
    return lines


def _version(checkout: Path) -> str:
    """A checkout's commit, if it is a git one."""
    done = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h"],
                          capture_output=True, text=True)
    return f"`{done.stdout.strip()}`" if done.returncode == 0 else f"`{checkout}`"


def run(quick: bool = False, runs: int | None = None, baseline: Path | None = None
        ) -> list[str]:
    runs = runs or (1 if quick else 21)
    sides, labels = list(PAIR), ["openai alone", "openai + exporter"]
    if baseline is not None:
        sides.append(("exporter", baseline.resolve()))
        labels.append(f"openai + exporter at {_version(baseline)}")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        env = {key: value for key, value in os.environ.items()
               if key != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        interpreters = {"installed": Path(sys.executable),
                        "not installed": venv_without("anthropic", Path(tmp) / "venv")}
        rounds = {where: pairs(python, env, runs) for where, python in interpreters.items()}
        with ProviderServer() as provider:
            calls = pairs(Path(sys.executable), env, runs, provider.base_url + "/v1", sides)
    added = rounds["installed"][-1][1]["added"]
    leaked = [name for name in added if name.startswith(SERVER_SIDE)]
    sdk_first = set(calls[-1][0]["first_loaded"])
    first_loads = []
    for side, label in enumerate(labels[1:], 1):
        beyond = [m for m in calls[-1][side]["first_loaded"] if m not in sdk_first]
        server_side = [m for m in beyond if m.startswith(SERVER_SIDE)]
        first_loads += [f"What the first call loads beyond the SDK's own resources, "
                        f"{label.removeprefix('openai + ')}: {_groups(beyond) or 'nothing'}; "
                        f"of the server side: {_groups(server_side) or 'none'}.", ""]
    try:
        load = f" Load average when the run ended: {os.getloadavg()[0]:.1f} on " \
               f"{os.cpu_count()} cores."
    except OSError:
        load = ""
    return [
        f"{runs} rounds per row, each a fresh interpreter per command, in turn (the order "
        f"reversed every other round), the bytecode cached; median (min) in ms.{load}", "",
        *startup_rows(rounds), "",
        f"Modules `import exporter; exporter.instrument()` adds after `import openai`: "
        f"{_groups(added)}; of the server side ({', '.join(SERVER_SIDE)}): "
        f"{_groups(leaked) or 'none'}.", "",
        "The first two calls of a client (a 4-chunk stream from the demo provider), in fresh "
        "interpreters:", "",
        *first_call_rows(calls, labels), "",
        *first_loads[:-1],
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup")
    parser.add_argument("--quick", action="store_true", help="one round (smoke test)")
    parser.add_argument("--runs", type=int, help="rounds per row (default 21)")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="a checkout of another version: its first call measured too")
    args = parser.parse_args(argv)
    print("\n".join(run(args.quick, args.runs, args.baseline)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
