# The two commands a user needs: `make demo` and `make test`. Both set up
# everything they need on a fresh Debian 12 machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench setup clean test-deps

setup: $(STAMP)

$(STAMP): pyproject.toml
	@./scripts/bootstrap-python.sh "$(PY)" "$(VENV)"
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rackguard demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Debian packages and services the tests use (systemd-analyze, snmpd, Slurm, ...).
test-deps:
	@./scripts/install-test-deps.sh

unit: $(STAMP) test-deps
	$(BIN)/pytest -q $(PYTEST_ARGS)

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
