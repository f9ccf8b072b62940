"""Every Python the package claims (`requires-python = ">=3.10"`): no standard-library API newer
than 3.10 is used outside exporter/_internal/compat.py, and compat's 3.10 code is right, on
this Python and under each other one installed here. `make pythons` installs the package on
each Python and runs tests/pythons/smoke.py; these are the suite's fast part of it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exporter._internal import compat
from tests.pythons import compat_checks
from tests.pythons.run import PYTHONS, StepFailed, interpreter

PACKAGE = Path(compat.__file__).resolve().parents[1]
COMPAT = Path(compat.__file__).resolve()
GENERATED = {PACKAGE / "_internal" / "expose" / "proto" / "metrics_pb2.py"}

#: Standard-library names added (or, for fromisoformat, widened) after 3.10, by qualified name.
NEWER_THAN_3_10 = {
    # 3.11
    "asyncio.timeout", "asyncio.timeout_at", "asyncio.Timeout", "asyncio.TaskGroup",
    "asyncio.Runner", "asyncio.Barrier", "ExceptionGroup", "BaseExceptionGroup", "tomllib",
    "typing.Self", "typing.LiteralString", "typing.Never", "typing.assert_never",
    "typing.assert_type", "typing.reveal_type", "typing.Required", "typing.NotRequired",
    "typing.TypeVarTuple", "typing.Unpack", "typing.dataclass_transform", "enum.StrEnum",
    "enum.ReprEnum", "enum.verify", "enum.member", "enum.nonmember", "enum.global_enum",
    "enum.EnumCheck", "enum.FlagBoundary", "datetime.UTC", "hashlib.file_digest",
    "contextlib.chdir", "logging.getLevelNamesMapping", "sys.exception", "operator.call",
    "math.exp2", "math.cbrt", "wsgiref.types", "datetime.datetime.fromisoformat",
    "datetime.date.fromisoformat", "datetime.time.fromisoformat",
    # 3.12 and 3.13
    "typing.override", "typing.TypeAliasType", "itertools.batched", "sys.monitoring",
    "asyncio.eager_task_factory", "typing.ReadOnly", "typing.TypeIs", "warnings.deprecated",
    "copy.replace", "asyncio.Queue.shutdown",
}
#: Methods added after 3.10 (exceptions' notes, a task's cancellation count), found by name on
#: any object.
NEWER_METHODS = {"add_note", "uncancel", "cancelling"}


def newer_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each use of NEWER_THAN_3_10 in a module: imports, dotted names through
    any alias of their module, `except*`, and the 3.12 `type` statement and generic syntax."""
    aliases: dict[str, str] = {}  # local name -> qualified name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for name in node.names:
                aliases[name.asname or name.name.split(".")[0]] = \
                    name.name if name.asname else name.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for name in node.names:
                aliases[name.asname or name.name] = f"{node.module}.{name.name}"
    found = []
    for node in ast.walk(tree):
        qualified = ""
        if isinstance(node, ast.Import):
            found += [(node.lineno, n.name) for n in node.names if n.name in NEWER_THAN_3_10]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, f"{node.module}.{n.name}") for n in node.names
                      if f"{node.module}.{n.name}" in NEWER_THAN_3_10]
        elif isinstance(node, ast.Attribute):
            parts, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name):
                qualified = ".".join([aliases.get(inner.id, inner.id), *reversed(parts)])
            if node.attr in NEWER_METHODS:
                found.append((node.lineno, f"<object>.{node.attr}"))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            qualified = aliases.get(node.id, node.id)
        if qualified in NEWER_THAN_3_10:
            found.append((node.lineno, qualified))
        if type(node).__name__ in ("TryStar", "TypeAlias") or getattr(node, "type_params", None):
            found.append((node.lineno, type(node).__name__))
    return sorted(set(found))


def test_no_api_newer_than_3_10_outside_compat():
    uses = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
            for path in sorted(PACKAGE.rglob("*.py")) if path != COMPAT and path not in GENERATED
            for line, name in newer_uses(ast.parse(path.read_text(encoding="utf-8")))]
    assert not uses, ("3.11+ APIs used without a fallback (put one in exporter/_internal/"
                      "compat.py):\n" + "\n".join(uses))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="`except*` parses from 3.11 on")
def test_the_scan_finds_each_kind_of_use():
    source = """
import asyncio, tomllib
import asyncio as aio
from datetime import datetime
from typing import Self
async def f():
    async with aio.timeout(1):
        pass
    try:
        pass
    except* ValueError as group:
        group.add_note("x")
    datetime.fromisoformat("2024-05-01")
    raise ExceptionGroup("x", [])
"""
    assert [name for _, name in newer_uses(ast.parse(source))] == [
        "tomllib", "typing.Self", "asyncio.timeout", "TryStar", "<object>.add_note",
        "datetime.datetime.fromisoformat", "ExceptionGroup"]


def test_the_3_10_code_of_compat_on_this_python():
    """compat's own equivalents, whichever Python runs the suite (3.11 uses asyncio's)."""
    compat_checks.check_timeout(compat.timeout_before_3_11)
    compat_checks.check_fromisoformat(compat.fromisoformat_before_3_11)
    compat_checks.check_timeout(compat.timeout)
    compat_checks.check_fromisoformat(compat.fromisoformat)


def test_make_pythons_tests_every_python_the_package_claims():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    classified = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
                  if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert list(PYTHONS) == classified
    assert project["requires-python"] == f">={PYTHONS[0]}"


@pytest.mark.parametrize("version", PYTHONS)
def test_compat_under_each_python_installed_here(version):
    """compat loaded by each interpreter alone (stdlib only): on 3.10 it picks its own code."""
    try:
        python = interpreter(version)
    except StepFailed as missing:
        pytest.skip(str(missing))
    run = subprocess.run([python, compat_checks.__file__, str(COMPAT)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"compat ok on {version}."), run.stdout
