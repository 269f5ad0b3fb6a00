# Two commands on a fresh Debian machine with Python 3.11+: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck unit bench clean zookeeper

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "streamlet needs Python 3.11+ (found $$($(PYTHON) --version))"; exit 1; }
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python venv support missing; installing python3-venv"; \
	  (apt-get update -qq && apt-get install -y -qq python3-venv) >/dev/null && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,cluster,kafka]'
	@touch $(STAMP)

# The cluster tests need a real ZooKeeper server (and Java); install Debian's when it is missing.
zookeeper:
	@test -e /usr/share/java/zookeeper.jar || test -n "$$ZOOKEEPER_HOME" || { \
	  echo "installing ZooKeeper (apt-get install -y zookeeper)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper) >/dev/null; }

run: $(STAMP)
	$(BIN)/python examples/wordcount.py

lint: $(STAMP)
	$(BIN)/ruff check streamlet tests examples benchmarks
	$(BIN)/ruff format --check streamlet tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) zookeeper
	$(BIN)/pytest -q

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m benchmarks wordcount --json
	$(BIN)/python -m benchmarks latency --json
	$(BIN)/python -m benchmarks windows --json
	$(BIN)/python -m benchmarks checkpoint --json
	$(BIN)/python -m benchmarks tcp --json
	$(BIN)/python -m benchmarks cluster --json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
