# bullmq-compat — set-up, tests, benchmarks.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# a venv with the runtime dependencies alone: what a user's worker starts with (scripts/bench_startup.py)
STARTUP_VENV := bench-results/.venv-startup

.PHONY: setup test bench bench-memory demo clean upstream interop browser postgres prometheus chaos dist pgbench

setup: $(STAMP) upstream interop interop/lua/addGroupJob.lua browser postgres prometheus valkey

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

# pgbench, for the commit ceiling of make bench's PostgreSQL rows (Debian ships it with the server,
# postgresql-<major>; postgresql-contrib pulls that in); bench only: without it that column is skipped
pgbench:
	@command -v pgbench >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/pgbench >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-contrib >/dev/null; } || \
		echo "NOTE: pgbench could not be installed: the PostgreSQL rows get no commit ceiling"

# Debian's Prometheus server, for tests that start one of their own (tests/test_prometheus.py); the
# package's own service (on 9090) is stopped and disabled where it was started: the tests need none
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
		systemctl disable --now prometheus >/dev/null 2>&1 || true; \
		update-rc.d prometheus disable >/dev/null 2>&1 || true; \
		service prometheus stop >/dev/null 2>&1 || true; }

# Valkey 8, the server upstream BullMQ's CI runs, from Debian's <codename>-backports: valkey-server and
# valkey-tools unpacked into .valkey/ (no service installed; apt runs on a sources list of its own,
# derived from the machine's Debian entry). Tests start it for REDIS_SERVER=$(VALKEY_SERVER).
.PHONY: valkey test-valkey
VALKEY_SERVER := $(CURDIR)/.valkey/usr/bin/valkey-server
valkey: .valkey/.installed

.valkey/.installed: scripts/fetch_valkey.py
	$(PY) scripts/fetch_valkey.py $(CURDIR)/.valkey

# the interop (Redis) and reliability modules, run again by `make test` with Valkey as the suite's Redis
# (test_faults_partition.py: its Redis half only; the PostgreSQL half starts no Redis, so on Valkey it
# would only run the same PostgreSQL test twice)
VALKEY_TESTS := $(filter-out tests/test_interop_pg_%,$(wildcard tests/test_interop_*.py)) \
	tests/test_redis_faults.py tests/test_worker_resilience.py tests/test_chaos.py tests/test_acl.py \
	tests/test_leaks.py tests/test_faults_memory.py \
	tests/test_faults_partition.py::test_redis_partition_longer_than_the_lock

# the suite runs in TEST_WORKERS pytest-xdist processes (most tests wait on I/O, sleeps and subprocesses,
# so more workers than cores pay); TEST_WORKERS=0 runs it in this process. See tests/README.md.
TEST_WORKERS ?= 4
test: setup
	$(VENV)/bin/ruff check .
	$(VPY) -m mypy bullmq_compat
	d=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict -q -d $$d && rm -rf $$d
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)
	env -u REDIS_URL REDIS_SERVER=$(VALKEY_SERVER) $(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup \
		$(VALKEY_TESTS) $(PYTEST_ARGS)

# the whole suite with Valkey 8 as the suite's Redis (every redis-server the tests start is a valkey-server)
test-valkey: setup
	env -u REDIS_URL REDIS_SERVER=$(VALKEY_SERVER) $(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# the reliability suite at full size: 20,000-job crash soak, Redis restarts and faults, Redis full and paused,
# network partitions, leaks, 100,000 held jobs, PostgreSQL's SIGKILL soaks (2,000 jobs; 1,500 group jobs; the
# transactional worker's), restarts, low server timeouts and terminated sessions; a lock lost by a live worker fails here
chaos: setup
	BULLMQ_COMPAT_CHAOS=1 $(VPY) -m pytest -q tests/test_chaos.py tests/test_redis_faults.py tests/test_leaks.py \
		tests/test_faults_memory.py tests/test_faults_partition.py \
		tests/test_postgres_reliability.py tests/test_postgres_faults.py \
		tests/test_postgres_transactions.py::test_a_kill_soak_commits_each_completed_jobs_effects_exactly_once \
		tests/test_groups.py::test_a_group_with_many_held_jobs_does_not_delay_a_one_job_group \
		tests/test_interop_groups.py::test_node_workers_start_a_one_job_group_at_once_beside_a_huge_group

# the documentation site (mkdocs.yml over docs/, API reference from the docstrings) into site/;
# NO_MKDOCS_2_WARNING silences mkdocs-material's notice about its successor
.PHONY: docs
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict -d site

demo: setup
	$(VPY) scripts/demo.py

# the comparison rows (Node, the official port, ours), then what a PostgreSQL transaction costs (issue #29's pairs)
# (a row that misses its target under BENCH_ARGS=--check makes the target fail at the end, after every step ran)
bench: setup pgbench
	rc=0; $(VPY) scripts/bench.py $(BENCH_ARGS) || rc=$$?; \
	$(VPY) scripts/bench_transactions.py $(BENCH_TX_ARGS) && \
	$(VPY) scripts/bench_relay.py $(BENCH_RELAY_ARGS) && \
	$(VPY) scripts/bench_pg_gate.py $(BENCH_GATE_ARGS) && \
	{ test -x $(STARTUP_VENV)/bin/python || ($(PY) -m venv $(STARTUP_VENV) && $(STARTUP_VENV)/bin/pip install -q -e .); } && \
	$(VPY) scripts/bench_startup.py --python $(STARTUP_VENV)/bin/python $(BENCH_STARTUP_ARGS) && exit $$rc

# a worker's and a producer's RSS over 1,000,000 jobs (own redis-server; about 20 minutes)
bench-memory: setup
	$(VPY) scripts/bench_memory.py $(BENCH_MEMORY_ARGS)

clean:
	rm -rf $(VENV) bullmq_compat/_upstream interop/node_modules dist build .valkey
