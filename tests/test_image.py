"""The Dockerfile the Helm chart defaults to. No Docker engine runs here, so what can be checked
is checked: its build context (pyproject.toml, README.md, exporter/) builds and installs the
package with the `ttft-exporter` command, and serves without the generator's grafanalib; the
image's user, entrypoint and port are the ones the chart runs, under the documented image name;
its HEALTHCHECK command passes against a real `ttft-exporter serve` and fails without one; its
OCI labels are the package's; its base image is pinned by digest."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import yaml

from exporter._internal.config.settings import Config

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "ttft-exporter"


def instructions() -> list[tuple[str, str]]:
    """(instruction, arguments), continuation lines joined."""
    text = "\n".join(line for line in (ROOT / "Dockerfile").read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    lines = [" ".join(line.split()) for line in text.replace("\\\n", " ").splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line]


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
    # The image installs no extra: grafanalib (the generator's) is not a dependency, and the
    # aggregator's server is built without it; generate says which extra it needs.
    [metadata] = site.glob("ttft_exporter-*.dist-info/METADATA")
    requires = [line for line in metadata.read_text().splitlines()
                if line.startswith("Requires-Dist: grafanalib")]
    assert requires and all("extra ==" in line for line in requires), requires
    without = ("import sys; sys.path.insert(0, sys.argv[1]); sys.modules['grafanalib'] = None\n"
               "from exporter._internal.config.settings import Config\n"
               "from exporter._internal.expose.server import create_app\n"
               "from exporter._internal.fleet.aggregator import Aggregator\n"
               "create_app(lambda: None, Aggregator(Config()))\n"
               "from exporter.cli import main\n"
               "sys.exit(main(['generate', '--out', sys.argv[2]]))\n")
    run = subprocess.run([sys.executable, "-c", without, str(site), str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 2 and "pip install 'ttft-exporter[generate]'" in run.stderr, (
        run.stderr)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_healthcheck_passes_against_serve_and_fails_without_it(tmp_path: Path) -> None:
    ops = dict(instructions())
    healthcheck = ops["HEALTHCHECK"]
    command = json.loads(healthcheck.split("CMD", 1)[1])
    assert command[0] == "python" and f":{ops['EXPOSE']}/healthz" in command[-1]
    port = _free_port()
    probe = [sys.executable, *command[1:-1],
             command[-1].replace(f":{ops['EXPOSE']}/", f":{port}/")]
    serve = subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--port", str(port)],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(100):  # until it listens
            assert serve.poll() is None, serve.stderr.read() if serve.stderr else ""
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        assert subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    assert subprocess.run(probe, capture_output=True, timeout=30).returncode != 0


def test_the_image_is_labelled_and_its_base_pinned_by_digest() -> None:
    ops = dict(instructions())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    labels = dict(item.split("=", 1) for item in shlex.split(ops["LABEL"]))
    prefix = "org.opencontainers.image."
    assert labels[prefix + "version"] == project["version"]
    assert labels[prefix + "licenses"] == project["license"]
    assert labels[prefix + "source"].startswith("https://github.com/")
    assert labels[prefix + "source"] in Config().alerting.runbook_url
    assert re.fullmatch(r"python:3\.\d+-slim@sha256:[0-9a-f]{64}", ops["FROM"])
    assert "docker buildx imagetools inspect python:3.11-slim" in (ROOT / "Dockerfile").read_text()


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


REQUIREMENTS = ROOT / "requirements-image.txt"


def pins() -> dict[str, tuple[str, list[str]]]:
    """requirements-image.txt: normalized name -> (version, hashes); every line must be a
    `name==version` pin (a range, a URL or an option would not be reproducible)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    text = re.sub(r"\\\n", " ", REQUIREMENTS.read_text())
    out = {}
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        requirement, *options = line.split(" --hash=")
        req = Requirement(requirement.strip())
        (spec,) = req.specifier
        assert spec.operator == "==" and "*" not in spec.version, line
        hashes = [option.strip() for option in options]
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), line
        out[canonicalize_name(req.name)] = (spec.version, hashes)
    return out


def test_every_runtime_dependency_is_pinned_with_hashes_within_pyprojects_ranges() -> None:
    """What the image installs: each dependency of pyproject.toml (and the build backend) at
    one exact version inside its range, with hashes; every dependency of those pins pinned too
    (read from their installed metadata), so `pip install --require-hashes` fetches nothing
    else; and the Dockerfile installs exactly that, then the package alone without an index."""
    from importlib.metadata import requires
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pinned = pins()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    environment = {"python_version": "3.11", "extra": ""}  # the base image's Python
    wanted = [Requirement(r) for r in pyproject["project"]["dependencies"]]
    wanted += [Requirement(r) for r in pyproject["build-system"]["requires"]]
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not pinned in {REQUIREMENTS.name}"
        version = pinned[name][0]
        assert req.specifier.contains(version, prereleases=True), (req, version)
    for name in pinned:
        for line in requires(name) or ():
            dependency = Requirement(line)
            if dependency.marker is None or dependency.marker.evaluate(environment):
                assert canonicalize_name(dependency.name) in pinned, (name, line)
    ops = instructions()
    runs = [args for op, args in ops if op == "RUN" and "pip install" in args]
    assert ("COPY", f"{REQUIREMENTS.name} ./") in ops
    assert any(f"--require-hashes --no-deps -r {REQUIREMENTS.name}" in r for r in runs), runs
    package = [r for r in runs if r.rstrip().endswith(". && rm -rf /src")]
    assert package and all(o in package[0] for o in ("--no-deps", "--no-build-isolation",
                                                     "--no-index")), runs
    assert "make image-requirements" in (ROOT / "Dockerfile").read_text()
    assert "image-requirements:" in (ROOT / "Makefile").read_text()


def test_the_images_command_refuses_an_open_push_and_names_what_allows_it() -> None:
    """The image's CMD as is (`serve --addr 0.0.0.0`) without a push token: exit 2 and one
    line naming the token's setting, its env var (the Dockerfile's `docker run -e`) and the
    explicit opt-out; it never binds (the refusal comes first)."""
    import os

    ops = dict(instructions())
    command = json.loads(ops["CMD"])
    env = {k: v for k, v in os.environ.items() if k != "TTFT_EXPORTER_PUSH_TOKEN"}
    run = subprocess.run([sys.executable, "-m", "exporter.cli", *command], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    for named in ("aggregator.push_token_file", "TTFT_EXPORTER_PUSH_TOKEN",
                  "aggregator.allow_unauthenticated_push: true"):
        assert named in run.stderr
    assert "docker run -e TTFT_EXPORTER_PUSH_TOKEN=" in (ROOT / "Dockerfile").read_text()
