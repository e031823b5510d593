# Two entry points: `make demo` (set up and run everything) and `make test` (the suite CI runs).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000
# make test runs the suite on this many pytest-xdist workers (each its own test database and queues), then the tests
# marked exclusive one at a time. The process tests mostly wait, so three share two cores well.
TEST_WORKERS ?= 3

.PHONY: demo test test-fast install services browser database migrate lint format clean

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

demo: migrate
	$(BIN)/python manage.py collectstatic --noinput -v 0
	$(BIN)/python manage.py provision_demo --port $(PORT)
	PATH="$(abspath $(BIN)):$$PATH" PORT=$(PORT) $(BIN)/honcho start -f Procfile

test: install services browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) -m "not exclusive"
	$(BIN)/pytest -q -p no:cacheprovider --durations=10 -m exclusive

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
