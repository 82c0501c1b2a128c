# Convenience targets; the README's two commands work without make.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/medallion: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c .ci/constraints.txt -e '.[local,dev]'
	@touch $@

.PHONY: install
install: $(BIN)/medallion ## Create the virtualenv and install the project with dev tools

.PHONY: demo
demo: install ## Run the end-to-end demo on embedded defaults
	$(BIN)/medallion demo

.PHONY: test
test: install ## Run the test suite
	$(BIN)/python -m pytest

.PHONY: lint
lint: install ## Ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

.PHONY: typecheck
typecheck: install ## mypy on the packages
	$(BIN)/mypy

.PHONY: clean
clean: ## Remove the local lake, caches and build output
	rm -rf lakehouse build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
