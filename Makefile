# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

.PHONY: serve test lint bench
serve: $(BIN)/.installed
	$(BIN)/flightrec serve $(ARGS)

lint: $(BIN)/.installed
	$(BIN)/ruff check proxy tests bench migrations tools
	$(BIN)/ruff format --check proxy tests bench migrations tools
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

test: lint
	$(BIN)/pytest -q $(ARGS)

bench: $(BIN)/.installed
	$(BIN)/python -m bench $(ARGS)
