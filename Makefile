# Two jobs, each setting up what it needs on a fresh clone:
#   make eval   run the example eval set against the embedded target (needs an Anthropic endpoint)
#   make test   run the whole test suite offline (lint, types, tests)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: eval test lint setup real-components timing verify-goldens bench clean malloy-data
SET ?= ecommerce

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# pytest-randomly (a dev dependency, for the suite) is left out: eval items keep file order
# under it anyway, and its seed line would only be noise here.
eval: $(STAMP)
	$(BIN)/pytest -p no:randomly evals/$(SET) $(ARGS)

# The synthetic tables of evals/ecommerce-malloy (seeded; its conftest.py also makes them on
# first use). `make eval SET=ecommerce-malloy` runs that set on the real Malloy compiler.
malloy-data: $(STAMP)
	$(BIN)/evalloop malloy-data evals/ecommerce-malloy/ecommerce/data

verify-goldens: $(STAMP)
	$(BIN)/pytest -p no:randomly evals/ecommerce --eval-verify-goldens -q

lint: $(STAMP)
	$(BIN)/ruff check pytest_evalloop tests bench conftest_examples
	$(BIN)/ruff format --check pytest_evalloop tests bench conftest_examples
	$(BIN)/mypy

# The pinned claude CLI and a headless chromium, for the real-component tests (once; reused).
real-components: $(STAMP)
	VENV_BIN=$(BIN) tools/real_components.sh

# The last line names any real-component test that still skipped. Three workers on two cores:
# each waits on its child runs part of the time (docs/testing.md).
TEST_WORKERS ?= 3
test: lint real-components
	$(BIN)/pytest tests -n $(TEST_WORKERS) -q $(ARGS)

# The tests whose outcome once hung on the machine's speed, run N times idle and N times with
# two busy loops on the cores (docs/testing.md, "No test races the clock").
timing: $(STAMP)
	$(BIN)/python tools/timing_check.py $(ARGS)

bench: $(STAMP)
	$(BIN)/python bench/throughput.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
