# Two entry points: `make demo` (set up and run everything) and `make test` (the suite CI runs).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000

.PHONY: demo test install services browser database migrate lint format clean

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
	$(BIN)/pytest -q -p no:cacheprovider

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
