# Two entry points: `make demo` (set up and run everything) and `make test` (the suite CI runs).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000

.PHONY: demo test install services database migrate lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: requirements.txt requirements-dev.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

services:
	bash scripts/ensure_services.sh

database: install services
	$(BIN)/python scripts/ensure_database.py

migrate: database
	$(BIN)/python manage.py migrate --noinput -v 0

demo: migrate
	$(BIN)/python manage.py collectstatic --noinput -v 0
	$(BIN)/python manage.py provision_demo --port $(PORT)
	PATH="$(abspath $(BIN)):$$PATH" PORT=$(PORT) $(BIN)/honcho start -f Procfile

test: install services
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
