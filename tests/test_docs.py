"""The docs say what the code does: every metric docs/metrics.md names exists, every path,
module and panel a doc names exists, the reference tables are what `ttft-exporter generate`
writes from the definitions, and a default, threshold or metric stated in prose is the code's.
A renamed module or panel, or a changed default, fails here, not in front of a reader."""

from __future__ import annotations

import argparse
import functools
import glob
import importlib
import json
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from exporter import cli
from exporter._internal import names
from exporter._internal.config.schema import keys
from exporter._internal.evidence.thresholds import DEFAULT, Thresholds
from exporter._internal.expose import self_metrics
from exporter._internal.generate.files import VALUES_SCHEMA, values_schema
from exporter._internal.generate.reference import metrics_reference, reference_files

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "metrics.md").read_text()


def defined_names() -> set[str]:
    out = {f.name for f in names.HISTOGRAMS}
    out |= {f.window_name for f in names.HISTOGRAMS if f.name in {
        names.TTFT.name, names.FIRST_ANSWER.name, names.STALL.name, names.DURATION.name}}
    out |= {names.REQUESTS_TOTAL, names.REQUESTS_IN_FLIGHT}
    out |= {names.USAGE_INPUT_TOKENS, names.USAGE_CACHED_INPUT_TOKENS, names.UPSTREAM_REQUESTS}
    out |= {m.name for m in self_metrics.TABLE if self_metrics.WATCH not in m.served_by}
    out |= {counter.name for counter in names.COUNTERS}
    out |= {names.slo_calls_name(f) for f in names.SLO_FAMILIES.values()}
    return out


def test_every_metric_is_documented_and_every_documented_metric_exists():
    documented = set(re.findall(r"`((?:llm_client|ttft_exporter)_[a-z_]+)`", DOC))
    assert documented == defined_names()


def test_phases_outcomes_and_drop_reasons_are_documented():
    for word in (*names.PHASES, *names.OUTCOMES, *names.DROP_REASONS, *names.LABEL_FOLDS,
                 *names.TASK_KINDS, *names.DEADLINE_OUTCOMES, *names.FINISH_REASONS):
        assert f"`{word}`" in DOC or f" {word}" in DOC, word


def test_windowed_families_match_the_recorder():

    documented = set(re.findall(r"`(llm_client_[a-z_]+)_window_seconds`", DOC))
    assert {n.removesuffix("_seconds") for n in (f.name for f in names.WINDOWED)} == documented


# --- what the docs name exists ---

DOCS = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md",
                                                 ROOT / "helm" / "ttft-exporter" / "README.md"]
INTERNAL = ROOT / "exporter" / "_internal"
STAGES = sorted(p.name for p in INTERNAL.iterdir() if (p / "__init__.py").exists())
#: A repository path: a top folder, then path characters (globs and `<placeholders>` allowed).
PATH = re.compile(r"(?<![\w./-])((?:exporter|docs|tests|bench|helm|alerts|dashboards)/"
                  r"[\w./*<>{}-]*[\w/*])")
DOTTED = re.compile(r"(?<![\w./-])(exporter(?:\.[A-Za-z_]\w*)+)")
STAGE_MODULE = re.compile(rf"(?<![\w./-])((?:{'|'.join(STAGES)})/\w+(?:\.py)?)(?![\w/])")
#: A file named without its folder: it must exist somewhere in the repository.
BARE_FILE = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*\.(?:py|md|yaml|json|proto))\b")
#: `**Dashboard → Panel**`: a panel (or row) a doc sends the reader to.
PANEL_REF = re.compile(r"\*\*([A-Z][\w ]{1,40}) → ([^*]+?)\*\*")
DASHBOARDS = {"Overview": "ttft-overview", "Where the time goes": "ttft-phases",
              "Stream health": "ttft-stream-health",
              "Tenants and noisy neighbours": "ttft-tenants", "Agent tasks": "ttft-agent-tasks"}
#: Prometheus' own web UI, named the same way.
PROMETHEUS_UI = "Status"


def _doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@functools.lru_cache(maxsize=1)
def _repository_files() -> frozenset[str]:
    """The name of every file and folder of the repository, walked once: the skipped folders
    are never entered (.venv alone holds tens of thousands of files)."""
    skip = {".git", ".venv", "__pycache__", "node_modules"}
    out: set[str] = set()
    for _, folders, files in os.walk(ROOT):
        folders[:] = [f for f in folders if f not in skip]
        out.update(folders)
        out.update(f for f in files if f not in skip)
    return frozenset(out)


def _resolves(dotted: str) -> bool:
    """A module, or an attribute reached from the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_path_and_module_a_doc_names_exists(doc: Path):
    text = doc.read_text(encoding="utf-8")
    files = _repository_files()
    missing = [p for p in PATH.findall(text)
               if "<" not in p and not glob.glob(str(ROOT / p))]
    missing += [d for d in DOTTED.findall(text) if not _resolves(d)]
    missing += [m for m in STAGE_MODULE.findall(text)
                if not (INTERNAL / m).exists() and not (INTERNAL / f"{m}.py").exists()
                and not (INTERNAL / m).is_dir()]
    missing += [f for f in BARE_FILE.findall(text) if f not in files]
    assert not missing, f"{_doc_id(doc)} names what does not exist: {sorted(set(missing))}"


def test_the_architecture_names_every_internal_module():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = [f"{p.parent.name}/{p.stem}" for p in INTERNAL.glob("*/*.py")
               if p.stem != "__init__" and p.parent.name in STAGES]
    modules += [f"`{p.stem}`" for p in INTERNAL.glob("*.py") if p.stem != "__init__"]
    assert [m for m in modules if m not in text] == []


def _titles(uid: str) -> list[str]:
    """Every panel and row title of a committed dashboard."""
    data = json.loads((ROOT / "dashboards" / f"{uid}.json").read_text(encoding="utf-8"))
    out, todo = [], list(data["panels"])
    while todo:
        panel = todo.pop()
        out.append(panel.get("title", ""))
        todo.extend(panel.get("panels", []))
    return out


def test_every_panel_a_doc_points_to_exists():
    """A reference is a prefix of a panel or row title of the named dashboard (titles may go
    on, e.g. with "(top 10)")."""
    titles = {name: _titles(uid) for name, uid in DASHBOARDS.items()}
    wrong = []
    for doc in DOCS:
        for board, panel in PANEL_REF.findall(doc.read_text(encoding="utf-8")):
            board = board.strip()
            if board == PROMETHEUS_UI:
                continue
            panel = " ".join(panel.replace("`", "").split())
            if board not in titles or not any(t.startswith(panel) for t in titles[board]):
                wrong.append(f"{_doc_id(doc)}: {board} → {panel}")
    assert not wrong


def test_the_readme_says_what_it_is_then_the_two_commands_then_how_to_install():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    title, intro, rest = readme.split("\n\n", 2)
    assert title.startswith("# ") and intro.count(". ") == 0 and intro.endswith(".")
    commands = rest.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert rest.startswith("```sh\n") and [c.split()[:2] for c in commands] == [
        ["make", "demo"], ["make", "test"]]
    after = rest.split("```", 2)[2].lstrip("\n")
    assert after.startswith("## Use it in your service\n\n```sh\npip install ")


# --- the values the docs state are the code's ---

#: The prose (the generated reference tables are checked by regeneration).
PROSE = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts) + [
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


@pytest.mark.parametrize("doc", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
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


@pytest.mark.parametrize("doc", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
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


@pytest.mark.parametrize("doc", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_metric_a_doc_names_is_served(doc: Path):
    served = set(re.findall(r"^\| `(\w+)` \|", metrics_reference(), re.M))
    suffixes = ("", "_bucket", "_count", "_sum")
    named = set(re.findall(r"(?<![\w.])((?:llm_client|ttft_exporter)_[a-z_]*[a-z])(?![\w{(])",
                           doc.read_text(encoding="utf-8")))
    unknown = {n for n in named if not any(n.removesuffix(s) in served for s in suffixes if
                                           n.endswith(s))}
    assert not unknown


def test_the_readmes_config_example_is_valid_and_shows_the_defaults():
    """Every value of README's config block is the default, but the SLO override it shows."""
    import yaml

    from exporter._internal.config.loader import load

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Configuration", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    data = yaml.safe_load(block)
    load(data)  # check-config accepts it

    def leaves(value: Any, path: str) -> list[tuple[str, Any]]:
        if isinstance(value, dict):
            return [leaf for k, v in value.items() for leaf in leaves(v, f"{path}.{k}" if path
                                                                      else k)]
        return [(path, value)]
    shown = leaves({k: v for k, v in data.items() if k != "slos"}, "")
    shown += leaves(data["slos"][0], "slos[]")
    wrong = [(path, value) for path, value in shown
             if (list(DEFAULTS[path]) if isinstance(DEFAULTS[path], tuple) else DEFAULTS[path])
             != value]
    assert not wrong



# --- the command line the docs show is the parser's ---

COMMANDS = {name: sub for action in cli.build_parser()._actions
            if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}
OPTIONS = {name: {o for a in sub._actions for o in a.option_strings}
           for name, sub in COMMANDS.items()}
#: Another program named where a flag stands: its flags are not ours.
OTHER_PROGRAM = re.compile(r"(?i)prometheus\b(?! (URL|server)\b)|llama|vllm|\bhelm\b|\bpip\b|"
                           r"uvicorn|gunicorn|valgrind|callgrind|python -m|docker|chromium")
COMMAND = re.compile(r"ttft-exporter ([a-z][a-z-]*)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def units(text: str) -> list[tuple[str, str]]:
    """Where a flag belongs to the command named before it: a table row, a paragraph or list
    item, a code block's command (its `\\` continuations joined); each with what it stands
    under (the doc's introduction, its section's heading, its table's header), where another
    program may be named."""
    out: list[tuple[str, str]] = []
    sections = re.split(r"\n(?=#+ )", re.sub(r"\\\n", " ", text))
    for section in sections:
        heading = sections[0] + section.split("\n", 1)[0]
        for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )|```", section):
            lines = block.strip("\n").splitlines()
            if lines and lines[0].startswith("|"):
                out += [(f"{heading} {lines[0]}", line) for line in lines[1:]]
            else:
                out.append((heading, block))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_command_and_flag_a_doc_shows_is_the_parsers(doc: Path):
    """A flag after `ttft-exporter <command>` in the same row, paragraph or command line is
    that command's; a flag with no command before it, where no other program is named, is
    some command's. A backticked `ttft-exporter <word>` names a command that exists."""
    wrong = []
    for context, unit in units(doc.read_text(encoding="utf-8")):
        wrong += [f"no command {c!r}" for c in re.findall(
            r"`ttft-exporter ([a-z][a-z-]*)\b(?!:)", unit) if c not in COMMANDS]
        command = "other" if OTHER_PROGRAM.search(context) else None
        marks = sorted([(m.start(), m.group(1)) for m in COMMAND.finditer(unit)
                        if m.group(1) in COMMANDS]
                       + [(m.start(), "other") for m in OTHER_PROGRAM.finditer(unit)]
                       + [(m.start(), m.group(0)) for m in FLAG.finditer(unit)])
        for _, word in marks:
            if not word.startswith("--"):
                command = word
            elif command in COMMANDS:
                if word not in OPTIONS[command]:
                    wrong.append(f"`ttft-exporter {command}` has no {word}")
            elif command is None and not any(word in o for o in OPTIONS.values()):
                wrong.append(f"no command has {word}")
    assert not wrong, f"{_doc_id(doc)}: {sorted(set(wrong))}"


# --- every panel a doc names, arrow or not ---

#: `**Dashboard → A** and **B**`: B is a panel of the same dashboard (a sentence or list item).
SENTENCE = re.compile(r"(?<=[.;:])\s+(?=[A-Z*])|\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )")
BOLD = re.compile(r"\*\*([^*]+?)\*\*")
#: The "Title" row (or panel, panels) of a dashboard.
QUOTED_PANEL = re.compile(r"\"([A-Z][^\"]{2,60})\" (?:row|panels?)\b")


def test_every_panel_a_doc_names_without_an_arrow_exists():
    """A bold name after a `**Dashboard → Panel**` in the same sentence is a panel of that
    dashboard; a quoted title followed by "row" or "panel" is one of some dashboard."""
    titles = {name: _titles(uid) for name, uid in DASHBOARDS.items()}
    every = [t for board in titles.values() for t in board]
    wrong = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for sentence in SENTENCE.split(text):
            board = None
            for bold in BOLD.findall(sentence):
                name = " ".join(bold.replace("`", "").split())
                if "→" in name:
                    board = name.split("→")[0].strip()
                elif board in titles and not name.endswith((".", ":")) \
                        and not any(t.startswith(name) for t in titles[board]):
                    wrong.append(f"{_doc_id(doc)}: {board} → {name}")
        wrong += [f"{_doc_id(doc)}: {title}" for title in QUOTED_PANEL.findall(text)
                  if not any(t.startswith(title) for t in every)]
    assert not wrong


#: A test a doc names: `file.py::test_name`, or `::test_name` after one (the same file).
NAMED_TEST = re.compile(r"(?<![\w./-])((?:tests/)?(?:[\w/]+/)?test_\w+\.py)?::(test_\w+)")


def test_every_test_the_reliability_doc_names_exists():
    """docs/reliability.md cites the test that holds each row: `tests/x.py::test_y`, or a
    bare `test_fault_x.py` (tests/faults/) and `::test_y` after it; each must be defined."""
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    missing, file = [], None
    for named_file, test in NAMED_TEST.findall(text):
        if named_file:
            folder = ROOT if "/" in named_file else ROOT / "tests" / "faults"
            file = folder / named_file
        if file is None or not file.exists() or \
                not re.search(rf"^(?:async )?def {test}\(", file.read_text(), re.M):
            missing.append(f"{file.relative_to(ROOT) if file else '?'}::{test}")
    assert len(NAMED_TEST.findall(text)) > 50
    assert not missing, missing
