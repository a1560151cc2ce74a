# The two commands a new user needs: `make demo` and `make test`. Both set everything up first and
# are safe to run again (set-up steps that are done are skipped).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)

.PHONY: demo test test-all test-fast setup clean

demo: setup
	$(BIN)/eventlake demo

# ruff (pyproject.toml: pyflakes' checks) first: a seconds' look before the suite's minutes. Then two pytest
# processes side by side, each with its broker and, when it needs one, its Spark session: most tests on the Spark
# session in the first; the rest (the broker's tests, services and Spark JVMs started in subprocesses, unit tests)
# and the modules tests/conftest.py names in `_SECOND_LANE` in the second, whose report follows the first's.
# (pytest-xdist's --dist loadgroup cannot keep them apart: under pytest 9 its group marks do not reach the scheduler.)
test: setup
	$(BIN)/ruff check .
	@mkdir -p .eventlake
	@$(BIN)/python -m pytest -m "not heavy and (not spark_session or second_lane)" -p no:cacheprovider \
	  > .eventlake/test-second-lane.log 2>&1 & \
	second=$$!; trap 'kill -TERM $$second 2>/dev/null; wait $$second; exit 130' INT TERM; \
	$(BIN)/python -m pytest -m "not heavy and spark_session and not second_lane"; first_rc=$$?; \
	wait $$second; second_rc=$$?; \
	echo "== beside it, the second lane (.eventlake/test-second-lane.log):"; \
	cat .eventlake/test-second-lane.log; \
	test $$first_rc = 0 && test $$second_rc = 0

# Also the heavy tests: Airflow's real services driven through its REST API, the maintenance DAG, kill -9 of a
# rebuild at each step, the rebuild DAG with `airflow dags test` (about 25 more minutes).
test-all: setup
	$(BIN)/python -m pytest

# Unit tests only: no broker, no Spark, no Airflow (39 s on 2026-11-29, 1,062 tests). The part a developer touches: pytest -m kafka|spark|airflow.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not slow"

# Python packages (pinned by constraints.txt), then the JVM artifacts: the Kafka broker's jars and
# Spark's Delta and Kafka packages, fetched once into .cache/.
setup: $(STAMP)
	$(BIN)/eventlake setup

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "setup: installing pinned Python packages into $(VENV) (a few minutes the first time) ..."
	$(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt -e '.[test,bench]'
	@rm -f $(VENV)/.installed-*
	@touch $@

clean:
	-$(BIN)/eventlake kafka down
	rm -rf .eventlake
