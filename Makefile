# Two commands on a fresh machine with Python 3.11:
#   make run    set up .venv and run the main job on its embedded default
#               (World Model RL on Mini AutoResearch; CONFIG=configs/bandit.py for the theory)
#   make test   set up .venv, lint, and run the test suite (fast tier, then the real tier)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= runs/$(notdir $(basename $(CONFIG)))-$(shell date +%Y%m%d-%H%M%S)
CONFIG ?= configs/autoresearch_tiny.py

.PHONY: setup setup-test run test test-fast test-real test-slow test-all lint format clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# Test-only reference implementations (torch, transformers) for the checkpoint parity tests.
$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt requirements-ray.txt
	$(PY) -m pip install -q -r requirements-test.txt
	$(PY) -m pip install -q -r requirements-ray.txt
	touch $@

setup: $(VENV)/.installed

setup-test: $(VENV)/.installed-test

run: setup
	$(PY) -m wmrl.main --config=$(CONFIG) --workdir=$(WORKDIR)

lint: setup-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup-test
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Test files run in parallel, one worker per core up to 4 (pytest-xdist; each file stays on one
# worker, so its module fixtures are built once). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# Two tiers: the fast one (in-process: units, references, fake executors) first, then the real
# one (`real` marker: sandboxes, Ray nodes, subprocesses, multi-process JAX, end-to-end runs).
# The real tier's Ray tests (`ray` marker) run after the others, never beside them: an rlimits
# sandbox refuses to start while a Ray node listens on the host (docs/sandbox.md).
REAL_TIER = $(PY) -m pytest -m "real and not slow and not ray" -q --durations=15 $(XDIST) && \
	$(PY) -m pytest -m "ray and not slow" -q --durations=15 $(XDIST)

test: lint setup-test
	$(PY) -m pytest -m "not slow and not real" -q --durations=15 $(XDIST)
	$(REAL_TIER)

test-fast: setup-test
	$(PY) -m pytest -m "not slow and not real" -q --durations=15 $(XDIST)

test-real: setup-test
	$(REAL_TIER)

test-slow: setup-test
	$(PY) -m pytest -m "slow and not ray" -q
	$(PY) -m pytest -m "slow and ray" -q

test-all: lint setup-test
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
