# Two commands on a fresh Debian machine with Python 3.11+: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Spark needs Java 17 (or 21): use this machine's Java 17 when JAVA_HOME is not set.
JAVA_17 := /usr/lib/jvm/java-17-openjdk-amd64
ifeq ($(JAVA_HOME),)
ifneq ($(wildcard $(JAVA_17)/bin/java),)
export JAVA_HOME := $(JAVA_17)
endif
endif

.PHONY: run test lint typecheck docs unit spec mutation chaos busy nemesis bench clean zookeeper java browser nettools postgresql

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "streamlet needs Python 3.11+ (found $$($(PYTHON) --version))"; exit 1; }
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python venv support missing; installing python3-venv"; \
	  (apt-get update -qq && apt-get install -y -qq python3-venv) >/dev/null && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,cluster,spark,kafka,bench]'
	@touch $(STAMP)

# The cluster tests need a real ZooKeeper server (and Java); install Debian's when it is missing.
zookeeper:
	@test -e /usr/share/java/zookeeper.jar || test -n "$$ZOOKEEPER_HOME" || { \
	  echo "installing ZooKeeper (apt-get install -y zookeeper)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper) >/dev/null; }

# The PostgreSQL tests (and the docs' examples) initdb and start servers of their own from Debian's postgresql;
# install it when no PostgreSQL server binary is there.
postgresql:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || test -n "$$POSTGRES_BIN" || { \
	  echo "installing PostgreSQL (apt-get install -y postgresql)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >/dev/null; }

# Spark (the flagship example, the Spark tests) needs a Java runtime; install Debian's Java 17 when there is none.
java:
	@test -n "$$JAVA_HOME" || command -v java >/dev/null || { \
	  echo "installing Java 17 for Spark (apt-get install -y openjdk-17-jre-headless)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless) >/dev/null; }

# The partition tests and the nemesis put processes on test hosts: network namespaces (iproute2) cut apart by
# nftables drop rules (Debian's nftables).
nettools:
	@command -v ip >/dev/null && command -v nft >/dev/null || { \
	  echo "installing iproute2 and nftables for the partition tests (apt-get install -y iproute2 nftables)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 nftables) >/dev/null; }

# The dashboard test drives Debian's Chromium with Playwright (Playwright's own browser download cannot work here).
browser:
	@test -x /usr/bin/chromium || { \
	  echo "installing Chromium for the dashboard test (apt-get install -y chromium)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null; }

# The flagship: generated sensor readings -> event-time windows -> Spark (Parquet under out/) -> a summary.
run: $(STAMP) java
	$(BIN)/python examples/sensor_pipeline.py

lint: $(STAMP)
	$(BIN)/ruff check streamlet tests examples benchmarks docs/*.py
	$(BIN)/ruff format --check streamlet tests examples benchmarks docs/*.py

typecheck: $(STAMP)
	$(BIN)/mypy

# The documentation site (docs/, mkdocs.yml) into site/: MkDocs with the Material theme, the API reference by
# mkdocstrings from the docstrings. --strict: a broken link, a missing anchor or a docstring warning fails it.
# It reaches no other site (no inventories, no remote fonts).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

unit: $(STAMP) zookeeper java browser nettools postgresql
	$(BIN)/pytest -q --durations=30

test: lint typecheck docs unit

# The differential tests of tests/spec (models written from the docs) with thousands of examples each
# (make test runs a few hundred).
spec: $(STAMP)
	STREAMLET_SPEC_EXAMPLES=3000 $(BIN)/pytest -q tests/spec

# Mutation testing of the modules that decide answers (joins, windows, undo, restore, the error policy, the
# columnar fold): mutmut 3 runs each mutant against the tests that reach what it changed, then the score per
# module (tests/mutation: a survivor is killed by a new test or written down as equivalent, with a reason).
mutation: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[mutation]'
	rm -rf mutants
	STREAMLET_SPEC_EXAMPLES=50 STREAMLET_EXAMPLE_CAP=25 $(BIN)/mutmut run --max-children 2
	$(BIN)/python -m tests.mutation --at-least 0.9

# 5 000 seeded runs of the whole cluster under random faults, every answer checked (make test runs 60, and more with a guarantee switched off).
chaos: $(STAMP)
	$(BIN)/python -m streamlet.testing.chaos --seed 0 --runs 5000 --jobs 2 --json

# 20 seeded fault schedules against a real cluster on test hosts (network namespaces: root), about 35 s each;
# every answer checked (make test runs two fixed seeds).
# The busy-worker faults with the live rescale at 1.6 ms and at 5 ms of CPU per record (make test: 1.6 ms).
busy: $(STAMP) zookeeper java nettools
	STREAMLET_EXTENDED=1 STREAMLET_BUSY_RESCALE_HOLDS=0.0016,0.005 $(BIN)/pytest -q tests/faults/test_busy_workers.py

# The tests marked extended: long variants of what make test checks (a second nemesis schedule, the busy job at
# 5 ms a record, SparkSink on a Spark standalone cluster), left out of make test's 25 minutes.
extended: $(STAMP) zookeeper java nettools
	STREAMLET_EXTENDED=1 $(BIN)/pytest -q -m extended

nemesis: $(STAMP) zookeeper java nettools
	$(BIN)/python -m streamlet.testing.nemesis --seed 100 --runs 20 --json

bench: $(STAMP)
	$(BIN)/python -m benchmarks wordcount --json
	$(BIN)/python -m benchmarks latency --json
	$(BIN)/python -m benchmarks windows --json
	$(BIN)/python -m benchmarks checkpoint --json
	$(BIN)/python -m benchmarks tcp --json
	$(BIN)/python -m benchmarks cluster --json
	$(BIN)/python -m benchmarks spark --json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache out site
