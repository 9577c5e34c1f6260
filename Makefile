# Two commands on a fresh machine with Python 3.11:
#   make run    set up .venv and run the main job on its embedded default
#   make test   set up .venv, lint, and run the fast test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= runs/$(notdir $(basename $(CONFIG)))-$(shell date +%Y%m%d-%H%M%S)
CONFIG ?= configs/bandit.py

.PHONY: setup run test test-slow test-all lint format bench clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

setup: $(VENV)/.installed

run: setup
	$(PY) -m wmrl.main --config=$(CONFIG) --workdir=$(WORKDIR)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: lint
	$(PY) -m pytest -m "not slow" -q

test-slow: setup
	$(PY) -m pytest -m slow -q

test-all: lint
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
