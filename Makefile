# gpulab — `make e2e` and `make test` set up everything they need on a fresh machine.
SHELL := /bin/bash
PY := .venv/bin/python
BUILD := build
ASAN_RT := $(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libubsan.so)
FUZZ_SECONDS ?= 60

.PHONY: install lib lib-asan test test-unit test-asan lint bench fuzz e2e cluster cluster-down clean

install:
	@ci/bootstrap.sh
	@$(MAKE) --no-print-directory lib
	@$(PY) -m plugin.api.generate >/dev/null
	@ci/nvidia-plugin.sh >/dev/null

lib:
	@$(PY) -m fakenvml.native.build --variant release --out $(BUILD)

lib-asan:
	@$(PY) -m fakenvml.native.build --variant asan --out $(BUILD)

lint: install
	@.venv/bin/ruff check . && .venv/bin/ruff format --check .

# Every tier: unit and node tier, the fakenvml suite again under ASan+UBSan, a bounded
# fuzz run, then the cluster tier (real kind labs) through `make e2e`.
test: install lib-asan lint
	@$(MAKE) --no-print-directory test-unit test-asan fuzz e2e FUZZ_SECONDS=30

test-unit:
	@echo "==> tests (release library)"
	@$(PY) -m pytest -q tests

test-asan:
	@echo "==> tests/fakenvml under -fsanitize=address,undefined"
	@FAKENVML_LIBRARY=$(CURDIR)/$(BUILD)/asan/libnvidia-ml.so.1 \
	  LD_PRELOAD="$(ASAN_RT)" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  $(PY) -m pytest -q -p no:cacheprovider tests/fakenvml

fuzz: install
	@$(PY) -m fakenvml.native.fuzz --seconds $(FUZZ_SECONDS) --out $(BUILD)

bench: install
	@$(PY) -m bench.run --out $(BUILD)/bench.json

LAB ?= seed
PLUGIN ?= gpulab

# A lab up (re-using what exists), fakenvml and PLUGIN deployed, capacity checked.
cluster: install
	@$(PY) -m clusters up $(LAB) --plugin $(PLUGIN)

cluster-down: install
	@$(PY) -m clusters down $(LAB)

# The cluster tier: labs up, suites for both plugins (JUnit XML + a summary table), labs
# down unless KEEP=1.
E2E_JUNIT ?= $(BUILD)/e2e-junit.xml
e2e: install
	@echo "==> e2e: cluster-tier suites for gpulab and nvidia (seed lab)"
	@KEEP=$(KEEP) $(PY) -m pytest -q -p no:cacheprovider e2e --junitxml=$(E2E_JUNIT)

include ci/cluster.mk

clean:
	rm -rf $(BUILD)
