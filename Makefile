# bullmq-compat — set-up, tests, benchmarks.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test bench demo clean upstream interop

setup: $(STAMP) upstream interop

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]'
	touch $(STAMP)

upstream: $(STAMP)
	$(VPY) scripts/fetch_upstream.py

interop: interop/node_modules/.package-lock.json

interop/node_modules/.package-lock.json: interop/package.json interop/package-lock.json
	cd interop && npm ci --no-audit --no-fund --loglevel=error

test: setup
	$(VPY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(VPY) scripts/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) bullmq_compat/_upstream interop/node_modules
