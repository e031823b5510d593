# Entry points: `make demo` (set up and run everything), `make test` (lint and the suite) and `make test-long` (CI runs it
# after make test).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000
# Both test tiers run on this many pytest-xdist workers, each with its own test database and queues. The process tests
# mostly wait, so three share two cores well. make test deals tests out one at a time, slow ones first: in xdist's
# default chunks the first worker took every slow test while the others sat idle. The long tier deals them out file
# by file: the benchmark runs share one costly module fixture, which would otherwise start on every worker (and the
# crash matrix's points then run one after another, beside it). Neither tier groups by xdist_group marks: under
# pytest 9.2 those silently do nothing, each test still goes its own way.
TEST_WORKERS ?= 3
# Python writes its bytecode caches even where the environment says not to: the tests start a few hundred processes
# (materializers, relays, workers, commands), and each would compile the project's modules again; pytest keeps its
# rewritten test modules there too (a third of collection time).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast test-long test-cluster install services browser database migrate lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-bench.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

services:
	bash scripts/ensure_services.sh

# The browser tests drive the system's Chromium (Debian's package) through Playwright.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

database: install services
	$(BIN)/python scripts/ensure_database.py

migrate: database
	$(BIN)/python manage.py migrate --noinput -v 0

# The demo's /metrics answers its bearer token only (printed with the URLs): it names every tenant. Set
# SCHEDULER_METRICS_TOKEN to keep one across runs; otherwise each run makes one.
DEMO_METRICS_TOKEN := $(or $(SCHEDULER_METRICS_TOKEN),$(shell od -An -N16 -tx1 /dev/urandom | tr -d ' \n'))
demo: export SCHEDULER_METRICS_TOKEN = $(DEMO_METRICS_TOKEN)
demo: migrate
	$(BIN)/python manage.py collectstatic --noinput -v 0
	$(BIN)/python manage.py provision_demo --port $(PORT)
	PATH="$(abspath $(BIN)):$$PATH" PORT=$(PORT) $(BIN)/honcho start -f Procfile

PYTEST := $(BIN)/pytest -q -p no:cacheprovider
XDIST := -n $(TEST_WORKERS)

# Lint, then every test but the long ones (and the cluster's), against the real PostgreSQL and RabbitMQ. Under 5 minutes.
test: install services
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(PYTEST) --durations=15 $(XDIST) --maxschedchunk 1 -m "not long and not exclusive and not cluster"

# The long tier, which CI runs after make test: the crash matrix, every benchmark end to end and the console in
# Chromium in parallel, then the tests that need the machine to themselves (they restart the shared broker or bound
# timings), one at a time.
test-long: install services browser
	$(PYTEST) --durations=10 $(XDIST) --dist loadfile -m "long and not exclusive"
	$(PYTEST) --durations=10 -m exclusive

# The tests of tests/cluster (marked `cluster`; no other target selects them) against clusters of their own on this
# machine, never the shared servers: three RabbitMQ nodes (scripts/cluster/rabbitmq.sh, ports 5681-5683) and a
# PostgreSQL primary with a synchronous standby (scripts/cluster/postgres.sh, ports 5441-5442). They are started
# first and removed at the end (stopped, their data and logs kept, when a test failed); -rA prints each test's
# measurements (JSON lines). The tests' own DATABASE_URL and CELERY_BROKER_URL name the clusters (multi-host, failover
# lists), so whatever Django or Celery does in them stays there too.
test-cluster: export DATABASE_URL = $(shell bash scripts/cluster/postgres.sh url scheduler)
test-cluster: export CELERY_BROKER_URL = $(shell bash scripts/cluster/rabbitmq.sh urls)
test-cluster: install
	@status=0; \
	bash scripts/cluster/rabbitmq.sh start && bash scripts/cluster/postgres.sh start && \
		$(PYTEST) --durations=10 -rA -m cluster tests/cluster || status=$$?; \
	if [ $$status = 0 ]; then bash scripts/cluster/postgres.sh destroy; bash scripts/cluster/rabbitmq.sh destroy; \
	else bash scripts/cluster/postgres.sh stop; bash scripts/cluster/rabbitmq.sh stop; \
		echo "test-cluster failed: the clusters are stopped, their data and logs kept under $${SCHEDULER_CLUSTER_DIR:-$${TMPDIR:-/tmp}/scheduler-cluster} (destroy removes them)"; fi; \
	exit $$status

# The unit tier: no PostgreSQL, no RabbitMQ (their addresses point at a closed port, so a test that reached for one
# fails instead of passing on this machine only), property tests at a tenth of their examples. Under 30 s.
test-fast: install
	DATABASE_URL=postgres://nobody@127.0.0.1:1/none CELERY_BROKER_URL=amqp://nobody@127.0.0.1:1// \
		SCHEDULER_TEST_EXAMPLES_SCALE=0.1 $(BIN)/pytest -q -p no:cacheprovider tests/unit

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
