# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
SHELL := /bin/bash
HERE := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

ASSETS := pipeline/validate/assets/.fetched

.PHONY: venv jars jars-lock debezium jvm-archive bytecode demo test test-deep test-fast test-spark test-e2e test-airflow test-postgres lint typecheck bench bench-scale lock clean docs-assets browser compose-tool compose-env postgres debian

venv: $(STAMP)

# The scripts and styles of the Data Docs pages, bundled so that they open offline (npm).
docs-assets: $(ASSETS)
$(ASSETS): pipeline/validate/datadocs.py | $(STAMP)
	@if command -v npm >/dev/null; then \
	  $(BIN)/python -m pipeline.validate.datadocs fetch && touch $(ASSETS); \
	else echo "npm is missing: the Data Docs pages will load their scripts from public CDNs"; fi

# The Debian packages the tests use, each with the check that it is there:
# - chromium: the tests open the Data Docs, the Conflicts page and the trigger form in it,
#   headless;
# - docker-compose: its `config` check validates docker-compose.yaml (Docker itself is not
#   needed);
# - maven: fetches the jars of jars.lock (make jars);
# - default-jdk-headless: its javac builds the project's Delta log store (make jars);
# - postgresql-15 and its wal2json plugin: the real-source test (tests/e2e/test_real_sources.py)
#   starts three servers on loopback and exports their changes.
# What is missing is installed in one apt-get call.
HAS_maven := command -v mvn
HAS_default-jdk-headless := command -v javac
HAS_chromium := command -v chromium
HAS_docker-compose := command -v docker-compose
HAS_postgresql-15 := test -x /usr/lib/postgresql/15/bin/initdb
HAS_postgresql-15-wal2json := test -f /usr/lib/postgresql/15/lib/wal2json.so
define debian_install
	@missing=""; $(foreach p,$(1),$(HAS_$(p)) >/dev/null || missing="$$missing $(p)";) \
	  [ -z "$$missing" ] || { echo "installing Debian's$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; }
endef

debian:
	$(call debian_install,chromium docker-compose postgresql-15 postgresql-15-wal2json)
browser:
	$(call debian_install,chromium)
compose-tool:
	$(call debian_install,docker-compose)
postgres:
	$(call debian_install,postgresql-15 postgresql-15-wal2json)

# The secrets of docker-compose.yaml (the S3 server's keys, Airflow's JWT secret and
# Fernet key, the admin's password), random, in .env (git ignores it; Compose reads it).
# An existing .env is kept.
compose-env:
	@python3 $(HERE)docker/compose_env.py .env

$(STAMP): pyproject.toml constraints.txt
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|2[0-9])' || { \
	  echo "Java 17 or newer is required by Spark. On Debian: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	@$(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { \
	  echo "Python 3.11 is required (found $$($(PY) --version)); set PY=/path/to/python3.11"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# pip byte-compiles one file at a time; compileall below uses every core.
	$(BIN)/pip install -q --no-compile -c constraints.txt -e '.[dev]'
	@# Like pip, skip the few files that are not Python 3 (templates, examples).
	-$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" > /dev/null
	touch $(STAMP)

# The project's own bytecode: an editable install is not compiled, and where
# PYTHONDONTWRITEBYTECODE is set every process (each Airflow task, each Spark Python
# worker) would compile the modules it imports again. Quick when nothing changed.
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q pipeline dags plugins > /dev/null

# The JVM packages of jars.lock (Delta Lake, s3a), fetched once with Maven and checked
# against the lock's sha256s, and the project's log store built with javac
# (pipeline/spark/jars.py); CDR_MAVEN_REPO names Maven's local repository (CI gives it an
# empty one).
JARS := $(VENV)/share/cdr/jars/.locked
jars: $(JARS)
$(JARS): jars.lock $(wildcard pipeline/spark/java/*.java) | $(STAMP)
	$(call debian_install,maven default-jdk-headless)
	$(BIN)/cdr jars fetch
	@touch $(JARS)

# Debezium's embedded engine and PostgreSQL connector (debezium.lock), and the tests'
# capture program built against them (tests/helpers/debezium.py): the real-capture test.
DEBEZIUM := $(VENV)/share/cdr/debezium/.locked
debezium: $(DEBEZIUM)
$(DEBEZIUM): debezium.lock tests/java/DebeziumCapture.java | $(STAMP)
	$(call debian_install,maven default-jdk-headless)
	$(BIN)/python -m tests.helpers.debezium fetch
	@touch $(DEBEZIUM)

# Resolve jars.lock again from pipeline/spark/jars.py's ROOTS (a maintainer's step).
jars-lock: $(STAMP)
	$(BIN)/python -m pipeline.spark.jars lock

# The class-data archive of Spark's classes: each new driver JVM starts from it about 5 s
# faster (pipeline/spark/jvm.py). Built once per JDK and Spark, in about a minute.
jvm-archive: $(STAMP) $(JARS)
	@$(BIN)/python -c 'import sys; from pipeline.spark.jvm import usable_archive; sys.exit(usable_archive() is None)' \
	  || { echo "building the JVM's class-data archive (about a minute, once)"; $(BIN)/cdr jvm-archive; }

demo: $(STAMP) $(ASSETS) jvm-archive bytecode
	$(BIN)/cdr demo

# The Debian packages install while pip installs the venv. Then the archive's minute (one
# core) runs beside the docs assets, lint and typecheck (the other): its log is shown when
# it is done.
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=target venv debian
	@$(MAKE) --no-print-directory bytecode
	@$(MAKE) --no-print-directory jvm-archive > $(VENV)/jvm-archive.log 2>&1 & archive=$$!; \
	  $(MAKE) --no-print-directory $(ASSETS) lint typecheck debezium; checks=$$?; \
	  wait $$archive; built=$$?; cat $(VENV)/jvm-archive.log; \
	  [ $$checks -eq 0 ] && [ $$built -eq 0 ]
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(SLOWEST_FIRST); \
	  rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

# The test tiers are folders, by what they need (tests/conftest.py marks each test with its
# folder, and a run's summary gives each tier's time). `make test` runs them in TEST_WORKERS processes (pytest-xdist), each with its own Spark
# session and S3 server, one test file at a time (a module's cluster stays in one
# process). The whole suite keeps a core busy only about half the time (Spark's and
# Airflow's start-ups, the services' waits): two workers fill both. The files go in this
# order (xdist would otherwise send the files with the most tests first, and end on the
# long single tests): the slowest tiers first, so that the short files even out the end.
TEST_WORKERS ?= 2
SLOWEST_FIRST := tests/airflow tests/e2e tests/spark tests/unit

# The pipeline on exports of three real PostgreSQL servers (wal2json), and the same changes
# as Debezium and DMS write them.
test-postgres: $(STAMP) jvm-archive postgres
	$(BIN)/pytest tests/e2e/test_real_sources.py

# The deeper tier, before each resolve of an issue (CONTRIBUTING.md): the differential
# property test of the two paths with hundreds of generated histories and `cdr verify`
# of every date (tests/spark/test_two_paths.py), the commit-phase kills at more seeds.
test-deep: $(STAMP) jvm-archive
	CDR_DEEP=1 CDR_CRASH_SEEDS=1,2,3,4,5 $(BIN)/pytest tests/spark/test_two_paths.py tests/e2e/test_crash.py

# No Spark, no services: under a minute.
test-fast: $(STAMP)
	$(BIN)/pytest tests/unit

test-spark: $(STAMP) jvm-archive
	$(BIN)/pytest tests/spark

test-e2e: $(STAMP) jvm-archive debian
	$(BIN)/pytest tests/e2e

test-airflow: $(STAMP) jvm-archive browser
	$(BIN)/pytest tests/airflow

lint: $(STAMP)
	$(BIN)/ruff check pipeline dags plugins tests bench docs/examples
	$(BIN)/ruff format --check pipeline dags plugins tests bench docs/examples

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP) $(JARS)
	$(BIN)/python bench/resolve_bench.py
	$(BIN)/python bench/cell_bench.py
	$(BIN)/python bench/cdc_bench.py

# A night of 60K records against tables of 100K, 1M and 4M rows (bench/RESULTS.md).
bench-scale: $(STAMP) jvm-archive
	$(BIN)/python bench/scale.py

lock:
	$(BIN)/pip freeze --exclude-editable | grep -v '^replica-cdr' > constraints.txt.new
	@echo "review constraints.txt.new, keep the header of constraints.txt, then move it over"

clean:
	rm -rf .cdr-work .cdr-demo .airflow
