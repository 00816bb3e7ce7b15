# Top-level entry points. Each target installs its own dependencies first.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps build test demo bench clean pyref orpy fuzz test-sanitize

all: build

deps:
	@bash scripts/deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# orpy first: the solver-code judge's tests need PuLP / Pyomo (they are skipped, saying so, without).
test: build
	@bash scripts/setup_orpy.sh || echo "[orpy] PuLP / Pyomo not installed: the Python solver-code tests will be skipped"
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	$(BUILD)/trex demo
	bash recipes/or/run.sh --small --trex $(BUILD)/trex

# The headline table of BENCHMARKS.md, re-measured here (tools/bench/reproduce.sh): writes
# benchmarks/results/<date>-<time>-<machine>[-quick].md and .json. QUICK=1: fewer steps, same rows.
# PEERS=1: also install the PyTorch peers (make pyref) first; they run whenever .venv has torch and
# transformers, and without them the peer rows say "peer not installed". BENCH_ARGS: more reproduce.sh options, e.g. BENCH_ARGS='--peers none'.
PEERS ?= 0
QUICK ?= 0
BENCH_ARGS ?=
bench: build
	@if [ "$(PEERS)" = 1 ]; then $(MAKE) --no-print-directory pyref; fi
	bash tools/bench/reproduce.sh --trex $(BUILD)/trex $(if $(filter 1,$(QUICK)),--quick) $(BENCH_ARGS)

# libFuzzer targets of fuzz/ (clang, ASan + UBSan), FUZZ_SECONDS each (RELIABILITY.md).
FUZZ_SECONDS ?= 60
fuzz:
	@bash scripts/deps.sh fuzz
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

# Unit tests built with ASan + UBSan in build-asan/ (RELIABILITY.md).
test-sanitize: deps
	bash scripts/test_sanitize.sh

# Python reference environment (torch + transformers) for regenerating parity dumps.
pyref:
	bash scripts/setup_pyref.sh

# PuLP + Pyomo in .venv/ for judging Python solver-code outputs (trex or eval, docs/OR.md).
orpy:
	bash scripts/setup_orpy.sh

clean:
	rm -rf $(BUILD)
