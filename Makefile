# The README's commands. `make demo` and `make test` each set up .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/.dagster
# Dagster 1.13's `dagster` commands each warn that `dg` supersedes them (FutureWarning,
# "Function `..._command` is superseded"); they are the commands this project documents.
export PYTHONWARNINGS ?= ignore:Function `:FutureWarning

# The UI test drives Debian's chromium, never a browser download.
CHROMIUM := /usr/bin/chromium

.PHONY: setup browser demo test ui validate bench lint clean

# Byte-compiled once here, so no process compiles the project's sources itself: where
# PYTHONDONTWRITEBYTECODE is set (containers often set it) nothing would write the .pyc
# files, and every Zephyr worker, Dagster step and CLI call would compile them again
# (a tenth of a worker's start-up). Up-to-date files are skipped.
setup: $(VENV)/.installed
	@$(BIN)/python -m compileall -q marin_dagster assets resources

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "marin-dagster needs Python 3.11 or newer: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check --progress-bar off -q --upgrade pip
	$(BIN)/pip install --disable-pip-version-check --progress-bar off -e '.[dev]'
	touch $@

demo: setup
	$(BIN)/marin init "$(DAGSTER_HOME)"
	$(BIN)/dagster job execute -m marin_dagster.definitions -j shakespeare_nano_job

browser:
	@[ -x $(CHROMIUM) ] || { \
	  echo "The UI test needs Debian's chromium at $(CHROMIUM); installing it with apt-get."; \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; \
	  else echo "make test: cannot install chromium (not root and no sudo): run 'apt-get install chromium' as root, then make test again" >&2; exit 1; fi; \
	  { $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; } || { \
	    echo "make test: installing chromium with apt-get failed (see above): install Debian's chromium so that $(CHROMIUM) exists, then make test again" >&2; exit 1; }; }

test: setup browser
	$(BIN)/pytest

ui: setup
	$(BIN)/marin init "$(DAGSTER_HOME)"
	$(BIN)/dagster dev -w workspace.yaml

validate: setup
	$(BIN)/marin init "$(DAGSTER_HOME)"
	$(BIN)/dagster definitions validate -w workspace.yaml

# Every benchmark script, less baseline_llama.py (train.py's peer, a module it imports) and
# gpu_train_check.py (a GPU device run; `--tiny` rehearses it on the CPU).
BENCHMARKS := $(filter-out benchmarks/baseline_llama.py benchmarks/gpu_train_check.py,$(sort $(wildcard benchmarks/*.py)))

bench: setup
	@for script in $(BENCHMARKS); do echo "== $$script"; $(BIN)/python $$script || exit 1; done

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .dagster data
