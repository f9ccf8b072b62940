# `make demo` and `make test` set everything up on a fresh machine (see README).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test calm-test pythons bench diagnose-eval diagnose-prometheus generate install assets prometheus chromium valgrind screenshots proto image-requirements clean engine engine-tools engine-smoke diagnose-engine

# setup.py builds the optional C parts (exporter/_internal/*/_hot*.c) where gcc is found.
$(STAMP): pyproject.toml setup.py $(wildcard exporter/_internal/*/_hot*.c)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP) assets

# Debian's prometheus package brings prometheus and promtool; install it when missing.
prometheus:
	@if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; \
	fi

# The page's chart library (uPlot) from the npm registry, as package-lock.json pins it, copied
# into the package (committed too; tests/test_view.py proves the copies are this build).
VIEW_STATIC := exporter/_internal/view/static
assets:
	@if ! command -v npm >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm; \
	fi
	npm ci --no-audit --no-fund --loglevel=error
	cp node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css $(VIEW_STATIC)/
	cp node_modules/uplot/LICENSE $(VIEW_STATIC)/uPlot.LICENSE

# Debian's Chromium and ChromeDriver: the browser tests drive them with Playwright (no browser
# download).
chromium:
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; \
	fi

# Debian's valgrind: `make bench` counts a call's instructions part by part with callgrind.
valgrind:
	@if ! command -v valgrind >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends valgrind; \
	fi

demo: $(STAMP) assets
	$(VENV)/bin/ttft-exporter demo

# The calm demo's test (tests/test_calm_demo.py) runs a demo for 5+ minutes and judges its
# alerts: beside the rest of the suite on a 2-core machine it is starved (and starves the
# timing tests), so it has its own target.
# Three workers on two cores, each module on one (its module-scoped fixtures played once): most
# of the suite's time is real time (played schedules, Prometheus' scrape ticks, a browser),
# not CPU (docs/testing.md).
test: $(STAMP) assets prometheus chromium
	$(PY) -m pytest -q -n 3 --dist loadfile --durations=30 --ignore=tests/test_calm_demo.py --ignore=tests/engine

calm-test: $(STAMP) assets prometheus
	$(PY) -m pytest -q tests/test_calm_demo.py

# Every Python the package claims (requires-python), from the machine's pyenv: a fresh venv under
# build/pythons/ each, `pip install '.[sdks]'` as a user installs it (the C parts compiled for
# that Python), then tests/pythons/smoke.py (the aggregator and a push worker, the in-process
# exporter through the C and the Python paths, both SDKs) and the C-vs-Python tests.
pythons:
	$(PYTHON) tests/pythons/run.py

# docs/screenshots/*.png: each dashboard's page during the compressed day's noisy neighbour,
# taken by the browser test.
screenshots: $(STAMP) assets prometheus chromium
	TTFT_SCREENSHOTS=1 $(PY) -m pytest -q tests/test_view_browser.py

bench: $(STAMP) valgrind
	$(PY) -m pip install -q -e '.[test,bench]'  # the peers measured side by side
	$(PY) -m bench

# The cause decision on randomised scenarios: thresholds of detection chosen on one seed set,
# every figure measured on held-out seeds; then on the project's incident day, played three
# times against a real Prometheus (docs/diagnose.md, "Measured").
diagnose-eval: $(STAMP) prometheus
	$(PY) -m bench.diagnose_eval
	$(PY) -m bench.diagnose_day --days 3

# The first 100 held-out scenarios end to end: recorded into the exporter, scraped by a real
# Prometheus (classic and native), named by `ttft-exporter diagnose` (docs/diagnose.md).
diagnose-prometheus: $(STAMP) prometheus
	$(PY) -m bench.diagnose_prometheus --seeds 100000:100100

# Then check that every panel queries a metric the exporter serves or its rules record.
generate: $(STAMP)
	$(VENV)/bin/ttft-exporter generate
	$(VENV)/bin/ttft-exporter generate --check

# Regenerate exporter/_internal/expose/proto/metrics_pb2.py from metrics.proto with protoc 26.1
# (the oldest protobuf runtime the package supports loads it), in a scratch venv: grpcio-tools is
# no dependency of the project.
PROTO_DIR := exporter/_internal/expose/proto
proto:
	$(PYTHON) -m venv /tmp/ttft-protoc
	/tmp/ttft-protoc/bin/pip install -q 'grpcio-tools==1.64.1'
	rm -rf /tmp/ttft-protoc-out && mkdir /tmp/ttft-protoc-out
	/tmp/ttft-protoc/bin/python -m grpc_tools.protoc \
		--proto_path=io/prometheus/client/metrics.proto=$(PROTO_DIR)/metrics.proto \
		--proto_path=$$(/tmp/ttft-protoc/bin/python -c 'import grpc_tools, os; print(os.path.dirname(grpc_tools.__file__))')/_proto \
		--python_out=/tmp/ttft-protoc-out io/prometheus/client/metrics.proto
	cp /tmp/ttft-protoc-out/io/prometheus/client/metrics_pb2.py $(PROTO_DIR)/metrics_pb2.py

# A real inference engine (docs/engine.md): llama.cpp's llama-server, built from the pinned
# llama-cpp-python sdist (PyPI) with Debian's cmake and g++ into
# ${TTFT_ENGINE_CACHE:-~/.cache/ttft-exporter} (10-16 min on 2 cores the first time, seconds
# after), and a tiny random-weight model written with `gguf` (the `engine` extra).
ENGINE_STAMP := $(VENV)/.engine-installed
$(ENGINE_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,engine]'
	touch $(ENGINE_STAMP)

engine-tools:
	@if ! { command -v cmake && command -v g++; } >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cmake g++ make; \
	fi

engine: $(ENGINE_STAMP) engine-tools
	$(PY) -m bench.engine.build

# Calls through the real engine with the real openai SDK, instrumented, scraped from the
# exporter (tests/engine/; `make test` leaves them out: they need the build above).
engine-smoke: engine
	$(PY) -m pytest -q tests/engine

# requirements-image.txt, what the Dockerfile installs with `pip install --require-hashes`: the
# runtime dependencies of pyproject.toml and setuptools (the wheel's build backend), resolved
# for the image's Python (3.11, the Dockerfile's base) at exact versions, each with the hashes of
# every file PyPI has for it (every platform of the base image). pip-tools runs in a scratch
# venv: it is no dependency of the project. Run it after changing a dependency's range, or to
# take newer releases (a fixed advisory); tests/test_image.py checks the pins against the ranges.
IMAGE_PYTHON ?= python3.11
image-requirements:
	$(IMAGE_PYTHON) -m venv /tmp/ttft-pip-tools
	/tmp/ttft-pip-tools/bin/pip install -q 'pip-tools>=7.4,<8'
	rm -rf /tmp/ttft-image-requirements && mkdir -p /tmp/ttft-image-requirements/exporter
	cp pyproject.toml README.md /tmp/ttft-image-requirements/
	touch /tmp/ttft-image-requirements/exporter/__init__.py
	cd /tmp/ttft-image-requirements && /tmp/ttft-pip-tools/bin/pip-compile -q --upgrade \
		--generate-hashes --allow-unsafe --strip-extras --build-deps-for wheel \
		--no-emit-index-url --no-emit-find-links --no-emit-options \
		--output-file requirements-image.txt pyproject.toml
	cp /tmp/ttft-image-requirements/requirements-image.txt requirements-image.txt

clean:
	rm -rf $(VENV) build *.egg-info

# diagnose on a real engine (bench/diagnose_engine.py, docs/diagnose.md "On a real engine"): each
# failure mode and look-alike produced by mechanism on llama-server, held-out seeds, ~40 min.
diagnose-engine: engine prometheus
	$(PY) -m bench.diagnose_engine
