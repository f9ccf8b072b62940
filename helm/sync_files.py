"""Copy the generated alerts/ and dashboards/ into the Helm chart (Helm reads files only from
inside the chart directory). `ttft-exporter generate` writes the copies itself when run at the
repository's top; this script is for originals edited any other way. tests/test_helm.py fails
while the chart's copies differ from the committed originals.

    python helm/sync_files.py          # copy
    python helm/sync_files.py --check  # exit 1 when a copy is missing or differs
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART_FILES = ROOT / "helm" / "ttft-exporter" / "files"
#: (source directory, pattern) -> copied to CHART_FILES / <source directory name>
SOURCES = (("alerts", "*.yaml"), ("dashboards", "*.json"), ("alerts/native", "*.yaml"),
           ("dashboards/native", "*.json"))


def pairs() -> list[tuple[Path, Path]]:
    """(original, chart copy) for every file the chart carries."""
    out = []
    for directory, pattern in SOURCES:
        for source in sorted((ROOT / directory).glob(pattern)):
            out.append((source, CHART_FILES / directory / source.name))
    return out


def stale() -> list[str]:
    """Chart copies that are missing, differ from their original, or have no original."""
    problems = [str(copy.relative_to(ROOT)) for source, copy in pairs()
                if not copy.exists() or copy.read_bytes() != source.read_bytes()]
    expected = {copy for _, copy in pairs()}
    for directory, pattern in SOURCES:
        for copy in sorted((CHART_FILES / directory).glob(pattern)):
            if copy not in expected:
                problems.append(f"{copy.relative_to(ROOT)} (no original)")
    return problems


def sync() -> list[Path]:
    written = []
    expected = set()
    for source, copy in pairs():
        expected.add(copy)
        copy.parent.mkdir(parents=True, exist_ok=True)
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            shutil.copyfile(source, copy)
            written.append(copy)
    for directory, pattern in SOURCES:
        for copy in (CHART_FILES / directory).glob(pattern):
            if copy not in expected:
                copy.unlink()
                written.append(copy)
    return written


def main(argv: list[str]) -> int:
    if "--check" in argv:
        problems = stale()
        for problem in problems:
            print(f"stale chart copy: {problem}", file=sys.stderr)
        return 1 if problems else 0
    for path in sync():
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
