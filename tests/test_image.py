"""The Dockerfile the Helm chart defaults to. No Docker engine runs here, so what can be checked
is checked: its build context (pyproject.toml, README.md, exporter/) builds and installs the
package with the `ttft-exporter` command, and the image's user, entrypoint and port are the
ones the chart runs, under the documented image name."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "ttft-exporter"


def instructions() -> list[tuple[str, str]]:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def test_the_build_context_installs_the_package_and_its_command(tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    copied = [args.split()[:-1] for op, args in instructions() if op == "COPY"]
    for sources in copied:
        for source in sources:
            target = context / source
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(ROOT / source, target)
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(wheels), str(context)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    [wheel] = wheels.glob("ttft_exporter-*.whl")
    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                              "--target", str(site), str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    [entry_points] = site.glob("ttft_exporter-*.dist-info/entry_points.txt")
    assert "ttft-exporter = exporter.cli:main" in entry_points.read_text()
    assert (site / "exporter" / "_internal" / "expose" / "server.py").is_file()
    run = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                          "from exporter.cli import main; main(['serve', '--help'])", str(site)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 0 and "--config" in run.stdout, run.stderr


def test_the_image_runs_what_the_chart_expects() -> None:
    ops = dict(instructions())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert ops["FROM"].startswith("python:3.")
    assert ops["USER"].split(":")[0] == str(values["podSecurityContext"]["runAsUser"])
    assert ops["EXPOSE"] == str(values["port"])
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert re.search(r'command: \["ttft-exporter"\]', deployment)
    assert ops["ENTRYPOINT"] == '["ttft-exporter"]'
    # The documented image name is what the chart pulls by default.
    assert values["image"]["repository"] == "ttft-exporter" and not values["image"]["tag"]
    assert chart["appVersion"] == version
    name = f"ttft-exporter:{version}"
    assert f"docker build -t {name} ." in (ROOT / "Dockerfile").read_text()
    assert name in (ROOT / "README.md").read_text()
    assert name in (CHART / "README.md").read_text()
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored and {"!pyproject.toml", "!README.md", "!exporter/"} <= set(ignored)
