"""`make pythons`: every Python the package claims (`requires-python`), tested as installed.

For each version (default: PYTHONS; or those given as arguments), with the machine's pyenv
interpreter (`$(pyenv root)/versions/3.X.*`, else `python3.X` on the PATH):

1. a fresh venv under build/pythons/3.X (git-ignored), and `pip install '.[sdks]'` from this
   checkout: wheels from the package index, the optional C parts compiled by setup.py against
   that Python's headers (their earlier build products for that Python removed first);
2. tests/pythons/smoke.py with that venv's interpreter: the C parts built, the aggregator and a
   push worker, the in-process exporter through the C and the Python paths, both SDKs;
3. except on the suite's own Python (`make test` runs them there), the tests that hold the C
   parts to the Python code (TWIN_TESTS), copied out of the checkout so that they import the
   installed package.

Prints each Python's version and the time of each step; exits 1 when any step failed on any
Python, after trying them all.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "pythons"
SMOKE = Path(__file__).resolve().with_name("smoke.py")
#: `requires-python = ">=3.10"` and every later release: keep in step with the classifiers.
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
#: The Python `make test` runs the whole suite on (the twin tests are part of it there).
SUITE_PYTHON = "3.11"
#: The tests that run the C parts and the Python code side by side (hypothesis included).
TWIN_TESTS = ("tests/test_stream_hot_loop.py", "tests/test_timeline.py",
              "tests/test_histogram.py", "tests/test_record_call.py",
              "tests/test_shim_support.py::test_c_trace_extension_steps_as_the_python_one")
#: The part of the test extra the twin tests need (their bounds are read from pyproject.toml).
TWIN_TEST_DEPS = ("pytest", "pytest-asyncio", "hypothesis")


class StepFailed(Exception):
    pass


def interpreter(version: str) -> str:
    """The newest pyenv 3.X.Y of `version`, else python3.X on the PATH."""
    root = os.environ.get("PYENV_ROOT") or _pyenv_root()
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"),
                   key=lambda p: [int(n) for n in re.findall(r"\d+", Path(p).parts[-3])])
    if found:
        return found[-1]
    on_path = shutil.which(f"python{version}")
    if on_path:
        return on_path
    raise StepFailed(f"no Python {version}: neither {root}/versions/{version}.*/bin/"
                     f"python{version} nor python{version} on the PATH (pyenv install {version})")


def _pyenv_root() -> str:
    try:
        return subprocess.run(["pyenv", "root"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(Path.home() / ".pyenv")


def twin_test_requirements() -> list[str]:
    """TWIN_TEST_DEPS with their bounds from pyproject.toml's test extra (no tomllib on 3.10)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^test = \[(.*?)^\]", text, re.S | re.M)
    assert extra is not None, "pyproject.toml has no test extra"
    wanted = []
    for requirement in re.findall(r'"([^"]+)"', extra.group(1)):
        name = re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0]
        if name in TWIN_TEST_DEPS:
            wanted.append(requirement)
    assert len(wanted) == len(TWIN_TEST_DEPS), f"the test extra lacks one of {TWIN_TEST_DEPS}"
    return wanted


def run(args: list[str], log: Path, what: str, cwd: Path = ROOT) -> float:
    """Run `args` with its output appended to `log`; its time, or StepFailed with the log's
    tail."""
    started = time.monotonic()
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(args)}\n")
        out.flush()
        code = subprocess.run(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL).returncode
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]
        raise StepFailed(f"{what} failed (exit {code}); the end of {log}:\n" + "\n".join(tail))
    return time.monotonic() - started


def fresh_install(python: str, version: str, venv: Path, log: Path) -> float:
    """A fresh venv with `pip install '.[sdks]'`, the C parts compiled anew for this Python."""
    shutil.rmtree(venv, ignore_errors=True)
    tag = "cpython-" + version.replace(".", "")
    for stale in glob.glob(str(ROOT / "build" / f"*{tag}*")):  # setuptools would reuse them
        shutil.rmtree(stale, ignore_errors=True)
    seconds = run([python, "-m", "venv", str(venv)], log, "creating the venv")
    return seconds + run([str(venv / "bin" / "python"), "-m", "pip", "install",
                          "--disable-pip-version-check", ".[sdks]"], log,
                         "pip install '.[sdks]'")


def twin_tests(venv: Path, log: Path) -> tuple[float, float]:
    """The C-vs-Python tests against the installed package: (install time, run time)."""
    python = str(venv / "bin" / "python")
    installed = run([python, "-m", "pip", "install", "--disable-pip-version-check",
                     *twin_test_requirements()], log, "installing the twin tests' requirements")
    suite = venv / "suite"  # no `exporter` here: the tests import the installed package
    shutil.rmtree(suite, ignore_errors=True)
    shutil.copytree(ROOT / "tests", suite / "tests",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", suite)  # pytest's options
    ran = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TWIN_TESTS], log,
              "the twin tests (C and Python side by side)", cwd=suite)
    return installed, ran


def one_python(version: str) -> dict[str, str]:
    """Every step on one Python; the row of the summary."""
    row = {"python": version}
    OUT.mkdir(parents=True, exist_ok=True)
    venv, log = OUT / version, OUT / f"{version}.log"
    log.write_text("", encoding="utf-8")
    try:
        python = interpreter(version)
        row["python"] = subprocess.run([python, "-c", "import platform; print("
                                        "platform.python_version())"], capture_output=True,
                                       text=True, check=True).stdout.strip()
        print(f"== Python {row['python']} ({python})", flush=True)
        row["install"] = f"{fresh_install(python, version, venv, log):.0f} s"
        print(f"  pip install '.[sdks]' in a fresh venv: {row['install']}", flush=True)
        started = time.monotonic()
        smoke = subprocess.Popen([str(venv / "bin" / "python"), str(SMOKE)], cwd=venv,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        for line in smoke.stdout or ():
            print(line, end="", flush=True)
            if line.strip().startswith("C parts"):
                row["C parts"] = "built" if line.strip().startswith("C parts built") else "no"
        smoke.wait()
        row["smoke"] = f"{time.monotonic() - started:.0f} s"
        if smoke.returncode != 0:
            raise StepFailed(f"the smoke failed on Python {row['python']} (above)")
        if version == SUITE_PYTHON:
            row["twin tests"] = "in make test"
        else:
            installed, ran = twin_tests(venv, log)
            row["twin tests"] = f"{ran:.0f} s"
            print(f"  twin tests passed: {ran:.0f} s (+{installed:.0f} s installing pytest)",
                  flush=True)
        row["result"] = "ok"
    except StepFailed as e:
        print(f"  FAILED: {e}", file=sys.stderr, flush=True)
        row["result"] = "FAILED"
    return row


def main(versions: list[str]) -> int:
    rows = [one_python(version) for version in versions]
    columns = ("python", "install", "C parts", "smoke", "twin tests", "result")
    print("\n| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    for row in rows:
        print("| " + " | ".join(row.get(k, "-") for k in columns) + " |")
    failed = [row["python"] for row in rows if row["result"] != "ok"]
    if failed:
        print(f"make pythons: FAILED on Python {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(PYTHONS)))
