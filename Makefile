# The two commands of the quick start. Both create the environment on first use:
# a virtual environment in .venv with the CPU build of torch 2.13.0 (pinned in
# constraints.txt, so pip never pulls a multi-GB CUDA build) and fedge installed editable.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fedge-installed
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
export FLWR_TELEMETRY_ENABLED := 0
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: quickstart test lint docs venv bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt $(FIND_LINKS) torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt $(FIND_LINKS) -e '.[test,flower,flower-sim]'
	touch $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/fedge run quickstart

# Two worker processes (one torch thread each, tests/conftest.py), a test file per worker at a time:
# the suite takes about half the single-process time on 2 cores. TEST_WORKERS=0 runs it in one process.
# The 15 slowest tests are listed at the end, so a CI log shows where the suite's time goes.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest --durations=15 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# ruff (lint + import order, and the formatter: `ruff format` fixes what --check finds) on src,
# tests, benchmarks; mypy (config in pyproject.toml) on src/fedge and benchmarks.
lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m mypy

# The documentation site (mkdocs.yml): MkDocs + Material + mkdocstrings, the `docs` extra installed
# into .venv on first use; --strict makes every warning (a broken link or cross-reference, a page
# missing from the nav) an error. The config reference is generated from the pydantic models.
DOCS_STAMP := $(VENV)/.fedge-docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt $(FIND_LINKS) -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) runs site .pytest_cache
