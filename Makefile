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

# Host packages the process runtime needs: bubblewrap, and gcc with libseccomp's headers to build the
# sandbox launcher (corral builds it on first use). Installed only when missing.
SYSTEM_PACKAGES := bubblewrap gcc libc6-dev libseccomp-dev
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing:$$missing: install them (apt-get install$$missing) for the process runtime"; fi; fi

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
