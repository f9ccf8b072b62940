"""The docs state only values the code has: the reference tables are what `ttft-exporter
generate` writes from the definitions, and where other prose states a config default, a
diagnosis threshold or a metric family, it is the code's."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from exporter._internal.config.schema import keys
from exporter._internal.diagnose.causes import DEFAULT, Thresholds
from exporter._internal.generate.files import VALUES_SCHEMA, values_schema
from exporter._internal.generate.reference import metrics_reference, reference_files

ROOT = Path(__file__).resolve().parent.parent
#: The prose (the generated reference tables are checked by regeneration).
DOCS = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts) + [
    ROOT / "README.md", ROOT / "helm" / "ttft-exporter" / "README.md"]
DEFAULTS: dict[str, Any] = {key.path: key.default for key in keys()}
THRESHOLDS: dict[str, Any] = {f.name: getattr(DEFAULT, f.name) for f in fields(Thresholds)}
UNITS = {"MiB": 2**20, "KiB": 2**10, "ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400,
         "%": 0.01, "": 1, "×": 1}
#: A number as prose writes it (thousands with commas), with its unit.
NUMBER = re.compile(r"(?<![\w.])(-?\d{1,3}(?:,\d{3})+|-?\d+(?:\.\d+)?)\s?(MiB|KiB|ms|s|m|h|d|%|×)?"
                    r"(?![\w])")
#: `key` (value...: prose stating a config key's value right after its name.
STATED = re.compile(r"`([a-z_]+(?:\.[a-z_]+)+)` \((?:default )?(`[^`]*`|-?\d[^);:]*)")


def numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) * UNITS[unit or ""] for n, unit in NUMBER.findall(text)]


def same(stated: str, default: Any) -> bool:
    """Does the text state `default`? Its first number, or a backticked string or list."""
    if stated.startswith("`"):
        value = ", ".join(default) if isinstance(default, tuple) else str(default)
        return stated.strip("`") == value
    if isinstance(default, str):
        return stated.strip() in (default, f'"{default}"')
    found = numbers(stated)
    return bool(found) and found[0] == pytest.approx(float(default))


def default_tables(text: str) -> list[list[list[str]]]:
    """Markdown tables whose second column is `default`, as rows of cells."""
    out = []
    for block in re.findall(r"(?:^\|.*\|\n)+", text, re.M):
        rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in block.splitlines()]
        if len(rows) > 2 and len(rows[0]) > 1 and rows[0][1] == "default":
            out.append(rows[2:])
    return out


def test_the_reference_tables_and_the_chart_schema_are_generated():
    for relative, text in reference_files().items():
        assert (ROOT / relative).read_text(encoding="utf-8") == text, (
            f"{relative} differs from `ttft-exporter generate`: regenerate it")
    committed = (ROOT / VALUES_SCHEMA).read_text(encoding="utf-8")
    assert values_schema(committed) == committed, "regenerate values.schema.json"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_config_default_a_doc_states_is_the_codes(doc: Path):
    text = doc.read_text(encoding="utf-8")
    wrong = [f"{key}: {stated}" for key, stated in STATED.findall(text)
             if key in DEFAULTS and not same(stated, DEFAULTS[key])]
    for table in default_tables(text):
        for row in table:
            named = re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", row[0])
            wrong += [f"{key}: {row[1]}" for key in named[:1]
                      if key in DEFAULTS and not same(row[1], DEFAULTS[key])]
    assert not wrong, f"{doc.name} states defaults the code does not have"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_threshold_a_doc_states_is_the_codes(doc: Path):
    """In a `| threshold | default |` table, a row naming `Thresholds` fields states their
    values, in that order, as the first distinct numbers of its second cell."""
    wrong = []
    for table in default_tables(doc.read_text(encoding="utf-8")):
        for row in table:
            named = [n for n in re.findall(r"`(\w+)`", row[0]) if n in THRESHOLDS]
            stated = list(dict.fromkeys(numbers(row[1])))[:len(named)]
            expected = list(dict.fromkeys(float(THRESHOLDS[n]) for n in named))
            if named and stated[:len(expected)] != pytest.approx(expected):
                wrong.append(f"{row[0]}: {row[1]}")
    assert not wrong


def test_the_runbooks_state_every_threshold():
    text = (ROOT / "docs" / "runbooks.md").read_text(encoding="utf-8")
    named = {n for table in default_tables(text) for row in table
             for n in re.findall(r"`(\w+)`", row[0])}
    assert set(THRESHOLDS) - {"min_calls"} <= named


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_metric_a_doc_names_is_served(doc: Path):
    served = set(re.findall(r"^\| `(\w+)` \|", metrics_reference(), re.M))
    suffixes = ("", "_bucket", "_count", "_sum")
    named = set(re.findall(r"(?<![\w.])((?:llm_client|ttft_exporter)_[a-z_]*[a-z])(?![\w{(])",
                           doc.read_text(encoding="utf-8")))
    unknown = {n for n in named if not any(n.removesuffix(s) in served for s in suffixes if
                                           n.endswith(s))}
    assert not unknown
