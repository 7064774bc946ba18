# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# requirements.lock pins every dependency, the dev ones too; the image installs from it and the
# tests run against it. As constraints it pins only what it lists, so a dependency added to
# pyproject.toml and not yet locked still installs (at its newest) until `make lock` is run.
$(BIN)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements.lock -e '.[dev]'
	touch $@

.PHONY: serve test lint bench lock
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

# Renew requirements.lock from pyproject.toml: the newest versions that fit, for Python 3.11 (the
# image's) on every platform; pins already in the lock that still fit are kept (`make lock
# ARGS=--upgrade` takes the newest of all). Needs only a venv with pip, so it runs when the
# lock is stale too.
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q 'uv>=0.5,<1'
	$(BIN)/uv pip compile pyproject.toml --quiet --extra dev --universal --python-version 3.11 \
		--custom-compile-command 'make lock' --output-file requirements.lock $(ARGS)
