# Every target does its own set-up: a fresh machine needs only `make <target>`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: serve test lint typecheck pytest bench bench-deps sim-report system-deps clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# Debian packages, each installed only when its command is missing: $(call apt,COMMAND,PACKAGE,WHY).
apt = @command -v $(1) >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null; \
	  else echo "$(2) missing: install it (apt-get install $(2)) for $(3)"; fi; }

# Host packages: bubblewrap (the process runtime), chromium (the dashboard's browser test).
system-deps:
	$(call apt,bwrap,bubblewrap,the process runtime)
	$(call apt,chromium,chromium,the dashboard's browser test)

# What the benchmarks add: wrk (bench/api.py's load generator).
bench-deps:
	$(call apt,wrk,wrk,bench/api.py)

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

# Every benchmark in bench/, then docs/benchmarks.md from their JSON lines. Not part of `make test`.
bench: $(STAMP) system-deps bench-deps
	$(BIN)/python bench/run_all.py docs/benchmarks.md

sim-report: $(STAMP)
	$(BIN)/python -m corral.sim.report docs

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
