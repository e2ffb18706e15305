# Every target does its own set-up: a fresh machine needs only `make <target>`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: serve test unasync lint typecheck pytest fuzz chaos fence-trials e2b-listing security-gvisor bench bench-deps sim-report system-deps clean

$(STAMP): pyproject.toml
	@echo "corral: making the virtual environment in $(VENV) (once; a minute or two on a fresh machine)"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@echo "corral: installing corral and its dependencies into $(VENV)"
	$(BIN)/pip install -q -e '.[server,sim,dev]'
	touch $(STAMP)

# Debian packages, each installed only when missing: $(call apt,PACKAGES,WHY) (no comma in WHY: make would cut it there).
apt = @missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "corral: installing$$missing ($(2))"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing:$$missing: install them (apt-get install$$missing) for $(2)"; fi; fi

# Host packages: bubblewrap, iproute2, nftables and conntrack (sandboxes' network slots), and gcc with libseccomp's headers to build the sandbox launcher (corral
# builds it on first use), for the process runtime; chromium for the dashboard's browser test; the image
# tools (mmdebstrap builds bases, mkfs.erofs packs them, umoci unpacks OCI layouts, mkfs.ext4 makes disks).
system-deps:
	$(call apt,bubblewrap gcc libc6-dev libseccomp-dev,the process runtime)
	$(call apt,chromium,the dashboard's browser test)
	$(call apt,iproute2 nftables conntrack,network slots: namespaces and veth pairs; their filters; scrubbing their connections)
	$(call apt,mmdebstrap erofs-utils umoci e2fsprogs,images: bases from Debian's archive; packing; OCI import; the writable layer)
	$(call apt,skopeo docker-registry,images: a recipe FROM a registry's image; and the loopback registry its tests run)
	$(call apt,runsc,the gvisor runtime)

# What the benchmarks add: wrk (bench/api.py's load generator).
bench-deps:
	$(call apt,wrk,bench/api.py)

# Flags for corral serve: make serve ARGS='--port 9000 --hosts 4'
ARGS ?=
serve: $(STAMP) system-deps
	$(BIN)/corral serve $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check corral tests bench scripts
	$(BIN)/ruff format --check corral tests bench scripts

# The blocking client is written from the asyncio one; tests/client/test_unasync.py fails when stale.
unasync: $(STAMP)
	$(BIN)/python scripts/unasync.py

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite on TEST_JOBS processes, each taking whole test files (their module fixtures built once).
TEST_JOBS ?= 2
pytest: $(STAMP) system-deps
	$(BIN)/pytest -q -n $(TEST_JOBS) --dist loadfile

test: lint typecheck pytest

# The OpenAPI fuzz of the suite, with many more cases per operation (FUZZ_EXAMPLES). Not part of `make test`.
FUZZ_EXAMPLES ?= 500
fuzz: $(STAMP)
	CORRAL_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -q -o timeout=3600 tests/control/test_openapi_fuzz.py

# The deterministic simulation with faults over many more seeds than the suite runs (CHAOS_SEEDS), on
# CHAOS_JOBS processes. A failing seed prints the command that replays it. Not part of `make test`.
CHAOS_SEEDS ?= 10000
CHAOS_JOBS ?= 2
chaos: $(STAMP)
	$(BIN)/corral sim chaos --seeds $(CHAOS_SEEDS) --jobs $(CHAOS_JOBS)

# The cut-off agent's self-fencing (its copies frozen before they run elsewhere), 20 trials. Not part
# of `make test`, which runs one.
FENCE_TRIALS ?= 20
fence-trials: $(STAMP)
	CORRAL_FENCE_TRIALS=$(FENCE_TRIALS) $(BIN)/pytest -q tests/e2e/test_failover.py -k cut_off

# E2B's listing over 100 sandboxes of one tenant in pages of 7, created and deleted while paging,
# through the unmodified SDK (the suite lists 15). Not part of `make test`.
E2B_LISTED ?= 100
e2b-listing: $(STAMP) system-deps
	CORRAL_E2B_LISTED=$(E2B_LISTED) $(BIN)/pytest -q -o timeout=900 tests/e2b/test_surface.py -k pages_of_seven

# The hostile suite (tests/security) with every attack run on gVisor as well as on the process runtime;
# `make test` runs a representative subset of the gVisor half (tests/security/conftest.py). Run before
# changing a runtime or resolving an isolation issue. Not part of `make test`.
security-gvisor: $(STAMP) system-deps
	CORRAL_SECURITY_GVISOR=all $(BIN)/pytest -q -o timeout=600 tests/security

# Every benchmark in bench/, then docs/benchmarks.md from their JSON lines. Not part of `make test`.
bench: $(STAMP) system-deps bench-deps
	$(BIN)/python bench/run_all.py docs/benchmarks.md

sim-report: $(STAMP)
	$(BIN)/python -m corral.sim.report docs

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
