# The two commands a user needs: `make demo` and `make test`. Both set up
# everything they need on a fresh Debian 12 machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench setup clean test-deps constraints

setup: $(STAMP)

# constraints.txt pins every package, so the tests run on the versions a node is
# told to install (docs/operations.md); `make constraints` refreshes it.
$(STAMP): pyproject.toml rackguard-sim/pyproject.toml constraints.txt
	@./scripts/bootstrap-python.sh "$(PY)" "$(VENV)"
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]' -e ./rackguard-sim
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rackguard-sim demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Debian packages and services the tests use (systemd-analyze, snmpd, Slurm, ...).
test-deps:
	@./scripts/install-test-deps.sh

# One worker per core, at most 4 (tests/conftest.py keeps the tests of one shared Slurm,
# systemd container or real-time cluster on one worker); PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= auto
unit: $(STAMP) test-deps
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadgroup $(PYTEST_ARGS)

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

constraints: $(STAMP)
	$(BIN)/pip install --quiet --upgrade -e '.[dev]' -e ./rackguard-sim
	{ echo "# Exact versions \`make\` and CI install (pip install -c constraints.txt ...)."; \
	  echo "# Regenerate with \`make constraints\` after changing pyproject.toml."; \
	  $(BIN)/pip freeze --all --exclude-editable --exclude pip | LC_ALL=C sort -f; } > constraints.txt

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
