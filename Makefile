# Three jobs, each setting up what it needs on a fresh clone:
#   make demo   the example set twice against the loopback fake, a baseline then a gated change
#               (no key, no network; runtime dependencies only)
#   make eval   run the example eval set against the embedded target (needs an Anthropic endpoint;
#               runtime dependencies only)
#   make test   run the whole test suite offline (lint, types, tests; the dev dependencies)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNTIME := $(VENV)/.installed-runtime

.PHONY: demo eval test lint setup real-components timing verify-goldens bench clean malloy-data
SET ?= ecommerce

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# What a run needs and nothing else (no linters, no test-only plugins).
$(RUNTIME): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

# The dev dependencies include the runtime ones.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(RUNTIME)

setup: $(STAMP)

# pytest-randomly (a dev dependency, for the suite) is left out: eval items keep file order
# under it anyway, and its seed line would only be noise here.
eval: $(RUNTIME)
	$(BIN)/pytest -p no:randomly evals/$(SET) $(ARGS)

demo: $(RUNTIME)
	$(BIN)/evalloop demo $(ARGS)

# The synthetic tables of evals/ecommerce-malloy (seeded; its conftest.py also makes them on
# first use). `make eval SET=ecommerce-malloy` runs that set on the real Malloy compiler.
malloy-data: $(STAMP)
	$(BIN)/evalloop malloy-data evals/ecommerce-malloy/ecommerce/data

verify-goldens: $(RUNTIME)
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
