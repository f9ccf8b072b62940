"""`python -m bench.engine.build`: llama.cpp's `llama-server`, built from the pinned
llama-cpp-python sdist into the cache, twice (two build numbers, so two `system_fingerprint`s),
and the tiny model beside it.

Nothing of llama.cpp is committed: the sdist comes from PyPI (hash checked), cmake and g++
build it under `${TTFT_ENGINE_CACHE:-$HOME/.cache/ttft-exporter}`. Each step leaves a stamp
holding the key of what it did (sdist hash, cmake options, build number); a step whose stamp
matches is skipped, any other is redone from scratch: a fresh machine (CI) builds everything
(10-16 minutes on 2 cores), a developer's second `make engine` takes seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_FILE = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
#: The llama.cpp commit the sdist vendors (its CHANGELOG: "update llama.cpp to
#: ggml-org/llama.cpp@0c1e57098"). Passed to cmake, as is the build number: cmake would read
#: them from git, which gives "unknown" where git is missing and a count of 1 where it is (the
#: sdist holds a one-commit history), so the fingerprint would depend on the machine.
LLAMA_CPP_COMMIT = "0c1e570"
#: LLAMA_USE_PREBUILT_UI=OFF: configure would fetch the web UI from outside PyPI (the server
#: runs without it). CMAKE_BUILD_RPATH_USE_ORIGIN: the server finds its libraries beside it
#: (`$ORIGIN`), not in the build tree, so each copied build runs its own.
CMAKE_OPTIONS = (
    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON", f"-DLLAMA_BUILD_COMMIT={LLAMA_CPP_COMMIT}",
)
#: llama-server answers `system_fingerprint: "b<build number>-<commit>"`, compiled into
#: libllama-common: two instances of one build cannot differ there. The second upstream runs a
#: second build that differs only in its number (a relink, not a rebuild), as a provider's
#: other region runs another deployment.
PRIMARY_BUILD, ALTERNATE_BUILD = 1, 2
SERVER_TARGET = "llama-server"


def cache_root() -> Path:
    return Path(os.environ.get("TTFT_ENGINE_CACHE") or Path.home() / ".cache" / "ttft-exporter")


def fingerprint_of(build_number: int) -> str:
    """The `system_fingerprint` a build answers with (llama.cpp's `llama_build_info()`)."""
    return f"b{build_number}-{LLAMA_CPP_COMMIT}"


@dataclass(frozen=True)
class Layout:
    """Where each step writes, under the cache root."""

    root: Path

    @property
    def src_parent(self) -> Path:
        return self.root / "engine-src"

    @property
    def tarball(self) -> Path:
        return self.src_parent / SDIST_FILE

    @property
    def source(self) -> Path:
        return self.src_parent / SDIST_FILE.removesuffix(".tar.gz")

    @property
    def llama_cpp(self) -> Path:
        return self.source / "vendor" / "llama.cpp"

    @property
    def build_dir(self) -> Path:
        return self.root / "engine-build"

    def install(self, build_number: int) -> Path:
        """A build's server and its shared libraries, copied out of the build tree."""
        return self.root / "engine-bin" / fingerprint_of(build_number)

    def server(self, build_number: int) -> Path:
        return self.install(build_number) / SERVER_TARGET

    @property
    def models(self) -> Path:
        return self.root / "engine-models"


def _key(**parts: object) -> str:
    return json.dumps(parts, sort_keys=True)


def _stamped(stamp: Path, key: str) -> bool:
    try:
        return stamp.read_text() == key
    except OSError:
        return False


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _say(message: str) -> None:
    print(f"[engine] {message}", flush=True)


def download(layout: Layout) -> Path:
    """The pinned sdist from PyPI with pip (no other registry), its hash checked."""
    if layout.tarball.is_file() and _sha256(layout.tarball) == SDIST_SHA256:
        return layout.tarball
    layout.src_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=layout.src_parent) as scratch:
        _say(f"downloading {SDIST_NAME}=={SDIST_VERSION} (sdist, 77 MB)")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", "-d", scratch,
                        f"{SDIST_NAME}=={SDIST_VERSION}"], check=True)
        got = Path(scratch) / SDIST_FILE
        digest = _sha256(got)
        if digest != SDIST_SHA256:
            raise SystemExit(f"{SDIST_FILE}: sha256 {digest}, expected {SDIST_SHA256}")
        os.replace(got, layout.tarball)
    return layout.tarball


def unpack(layout: Layout, tarball: Path) -> Path:
    """The sdist unpacked whole (a half-unpacked tree is removed and unpacked again). The
    archive's file times are kept, so a build tree already made from the same sdist stays
    up to date."""
    stamp = layout.src_parent / f".unpacked-{SDIST_VERSION}"
    key = _key(sha256=SDIST_SHA256)
    if _stamped(stamp, key) and layout.llama_cpp.is_dir():
        return layout.source
    _say(f"unpacking {tarball.name}")
    stamp.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=layout.src_parent) as scratch:
        with tarfile.open(tarball) as archive:
            if hasattr(tarfile, "data_filter"):  # 3.10.12+: no path outside the folder
                archive.extractall(scratch, filter="data")
            else:
                archive.extractall(scratch)  # noqa: S202 - the archive's hash was checked
        shutil.rmtree(layout.source, ignore_errors=True)
        os.replace(Path(scratch) / layout.source.name, layout.source)
    stamp.write_text(key)
    return layout.source


def _copy_install(build_bin: Path, install: Path) -> None:
    """llama-server and the shared libraries beside it (symlinks kept)."""
    scratch = install.with_name(install.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for item in sorted(build_bin.iterdir()):
        if item.name == SERVER_TARGET or ".so" in item.name:
            shutil.copy2(item, scratch / item.name, follow_symlinks=False)
    shutil.rmtree(install, ignore_errors=True)
    os.replace(scratch, install)


def build_server(layout: Layout, build_number: int, jobs: int | None = None) -> Path:
    """Configure and build `llama-server` with `build_number`, then copy it out of the build
    tree. The build tree is shared: a second build number recompiles one file and relinks."""
    install = layout.install(build_number)
    stamp = install / ".built"
    options = (*CMAKE_OPTIONS, f"-DLLAMA_BUILD_NUMBER={build_number}")
    key = _key(sha256=SDIST_SHA256, options=options, target=SERVER_TARGET)
    if _stamped(stamp, key) and (install / SERVER_TARGET).is_file():
        return install / SERVER_TARGET
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: `make engine` installs it with apt-get")
    started = time.monotonic()
    _say(f"building {SERVER_TARGET} {fingerprint_of(build_number)} in {layout.build_dir} "
         f"(from scratch: 10-16 min on 2 cores)")
    subprocess.run(["cmake", "-S", str(layout.llama_cpp), "-B", str(layout.build_dir), *options],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(layout.build_dir), "--target", SERVER_TARGET,
                    "-j", str(jobs or os.cpu_count() or 2)], check=True)
    _copy_install(layout.build_dir / "bin", install)
    (install / ".built").write_text(key)
    _say(f"built {install / SERVER_TARGET} in {time.monotonic() - started:.0f} s")
    return install / SERVER_TARGET


@dataclass(frozen=True)
class Engine:
    """What the harness runs: the two builds and the model."""

    server: Path
    alternate_server: Path
    model: Path


def installed(root: Path | None = None) -> Engine | None:
    """The engine as `make engine` left it, or None where a part is missing (never builds)."""
    from bench.engine import model

    layout = Layout(root or cache_root())
    parts = (layout.server(PRIMARY_BUILD), layout.server(ALTERNATE_BUILD),
             model.path_in(layout.models))
    return Engine(*parts) if all(p.is_file() for p in parts) else None


def ensure(root: Path | None = None) -> Engine:
    """Every step, each skipped when its stamp matches."""
    from bench.engine import model

    layout = Layout(root or cache_root())
    unpack(layout, download(layout))
    primary = build_server(layout, PRIMARY_BUILD)
    alternate = build_server(layout, ALTERNATE_BUILD)
    vocab = layout.llama_cpp / "models" / model.VOCAB_FILE
    return Engine(primary, alternate, model.ensure(layout.models, vocab))


def main() -> None:
    engine = ensure()
    _say(f"server    {engine.server}")
    _say(f"alternate {engine.alternate_server}")
    _say(f"model     {engine.model}")


if __name__ == "__main__":
    main()
