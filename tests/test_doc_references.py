"""What the docs name exists: every file path, dotted module path and module of a stage, and
every dashboard panel a runbook sends on-call to. A renamed module or panel fails here, not in
front of a reader."""

from __future__ import annotations

import glob
import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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


def _repository_files() -> set[str]:
    skip = {".git", ".venv", "__pycache__", "node_modules"}
    return {p.name for p in ROOT.rglob("*") if not skip & set(p.relative_to(ROOT).parts)}


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
