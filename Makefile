# `make demo` and `make test` set everything up on a fresh machine (see README).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench generate install prometheus clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Debian's prometheus package brings prometheus and promtool; install it when missing.
prometheus:
	@if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; \
	fi

demo: $(STAMP)
	$(VENV)/bin/ttft-exporter demo

test: $(STAMP) prometheus
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'  # the peers measured side by side
	$(PY) -m bench

generate: $(STAMP)
	$(VENV)/bin/ttft-exporter generate

clean:
	rm -rf $(VENV) build *.egg-info
