# bullmq-compat — set-up, tests, benchmarks.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test bench bench-memory demo clean upstream interop browser postgres prometheus chaos dist

setup: $(STAMP) upstream interop interop/lua/addGroupJob.lua browser postgres prometheus

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]'
	touch $(STAMP)

upstream: $(STAMP)
	$(VPY) scripts/fetch_upstream.py

# the sdist, then the wheel built from it, into dist/: both carry upstream's Lua, SQL and licence
# (setup.py fetches them; BULLMQ_COMPAT_UPSTREAM_TARBALL=bullmq-6.7.0.tgz builds offline)
dist: $(STAMP)
	rm -rf dist
	$(VPY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

interop: interop/node_modules/.package-lock.json

# our group script, built from bullmq_compat/_backends/redis/lua/ for Node producers (interop/groups.js)
interop/lua/addGroupJob.lua: $(wildcard bullmq_compat/_backends/redis/lua/*.lua bullmq_compat/_backends/redis/lua/includes/*.lua) | upstream
	mkdir -p interop/lua
	$(VPY) -m bullmq_compat lua addGroupJob > $@.tmp && mv $@.tmp $@

interop/node_modules/.package-lock.json: interop/package.json interop/package-lock.json
	cd interop && npm ci --no-audit --no-fund --loglevel=error

# Debian's chromium, for the Bull-Board browser test (tests/test_browser_board.py)
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Debian's PostgreSQL server binaries, for tests that start a cluster of their own (tests/_postgres_server.py)
postgres:
	@{ command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; } || \
		ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

# Debian's Prometheus server, for tests that start one of their own (tests/test_prometheus.py); the
# package's own service (on 9090) is stopped and disabled where it was started: the tests need none
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
		systemctl disable --now prometheus >/dev/null 2>&1 || true; \
		update-rc.d prometheus disable >/dev/null 2>&1 || true; \
		service prometheus stop >/dev/null 2>&1 || true; }

# the suite runs in TEST_WORKERS pytest-xdist processes (most tests wait on I/O, sleeps and subprocesses,
# so more workers than cores pay); TEST_WORKERS=0 runs it in this process. See tests/README.md.
TEST_WORKERS ?= 4
test: setup
	$(VENV)/bin/ruff check .
	$(VPY) -m mypy bullmq_compat
	d=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict -q -d $$d && rm -rf $$d
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# the reliability suite at full size: 20,000-job crash soak, Redis restarts and faults, leaks, 100,000 held jobs
chaos: setup
	BULLMQ_COMPAT_CHAOS=1 $(VPY) -m pytest -q tests/test_chaos.py tests/test_redis_faults.py tests/test_leaks.py \
		tests/test_groups.py::test_a_group_with_many_held_jobs_does_not_delay_a_one_job_group \
		tests/test_interop_groups.py::test_node_workers_start_a_one_job_group_at_once_beside_a_huge_group

# the documentation site (mkdocs.yml over docs/, API reference from the docstrings) into site/;
# NO_MKDOCS_2_WARNING silences mkdocs-material's notice about its successor
.PHONY: docs
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict -d site

demo: setup
	$(VPY) scripts/demo.py

bench: setup
	$(VPY) scripts/bench.py $(BENCH_ARGS)

# a worker's and a producer's RSS over 1,000,000 jobs (own redis-server; about 20 minutes)
bench-memory: setup
	$(VPY) scripts/bench_memory.py $(BENCH_MEMORY_ARGS)

clean:
	rm -rf $(VENV) bullmq_compat/_upstream interop/node_modules dist build
