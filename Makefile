# The README's commands. `make demo` and `make test` each set up .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/.dagster

.PHONY: setup demo test ui bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "marin-dagster needs Python 3.11 or newer: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check --progress-bar off -q --upgrade pip
	$(BIN)/pip install --disable-pip-version-check --progress-bar off -e '.[dev]'
	touch $@

demo: setup
	$(BIN)/marin init "$(DAGSTER_HOME)"
	$(BIN)/dagster job execute -m marin_dagster.definitions -j shakespeare_nano_job

test: setup
	$(BIN)/pytest

ui: setup
	$(BIN)/marin init "$(DAGSTER_HOME)"
	$(BIN)/dagster dev -w workspace.yaml

bench: setup
	@for script in benchmarks/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .dagster data
