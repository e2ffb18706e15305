# Every target does its own set-up: a fresh machine needs only `make <target>`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: serve test lint typecheck pytest bench sim-report system-deps clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# Host packages the process runtime needs (bubblewrap). Installed only when missing.
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "bubblewrap missing: install it (apt-get install bubblewrap) for the process runtime"; fi; }

serve: $(STAMP) system-deps
	$(BIN)/corral serve

lint: $(STAMP)
	$(BIN)/ruff check corral tests bench
	$(BIN)/ruff format --check corral tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) system-deps
	$(BIN)/pytest -q

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python bench/placement.py

sim-report: $(STAMP)
	$(BIN)/python -m corral.sim.report docs

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
