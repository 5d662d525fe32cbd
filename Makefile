# The two commands a user needs: `make demo` and `make test`. Both set up
# everything they need on a fresh Debian 12 machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench setup clean test-deps constraints native

setup: $(STAMP)

# constraints.txt pins every package, so the tests run on the versions a node is
# told to install (docs/operations.md); `make constraints` refreshes it.
$(STAMP): pyproject.toml rackguard-sim/pyproject.toml constraints.txt
	@./scripts/bootstrap-python.sh "$(PY)" "$(VENV)"
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]' -e ./rackguard-sim
	@touch $(STAMP)

# The policy's hot modules compiled by mypyc (policies/native.py): used only while
# they match the sources, so this rebuilds whenever a policy module changes.
NATIVE := build/native/manifest.json
native: $(NATIVE)

$(NATIVE): $(STAMP) $(wildcard policies/*.py) scripts/build_native.py
	@./scripts/install-build-tools.sh $(BIN)/python
	$(BIN)/python scripts/build_native.py

demo: $(STAMP)
	$(BIN)/rackguard-sim demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy scripts/build_native.py

# Debian packages and services the tests use (systemd-analyze, snmpd, Slurm, ...).
test-deps:
	@./scripts/install-test-deps.sh

unit: $(STAMP) test-deps $(NATIVE)
	$(BIN)/pytest -q $(PYTEST_ARGS)

test: lint typecheck unit

bench: $(STAMP) $(NATIVE)
	$(BIN)/python -m bench $(BENCH_ARGS)

constraints: $(STAMP)
	$(BIN)/pip install --quiet --upgrade -e '.[dev]' -e ./rackguard-sim
	{ echo "# Exact versions \`make\` and CI install (pip install -c constraints.txt ...)."; \
	  echo "# Regenerate with \`make constraints\` after changing pyproject.toml."; \
	  $(BIN)/pip freeze --all --exclude-editable --exclude pip | LC_ALL=C sort -f; } > constraints.txt

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build/native
