# Thin wrapper around CMake. Each target installs what is missing (scripts/install-deps),
# configures and builds, then does its job.
#
#   make train   build and run the main job (configs/quickstart.yaml)
#   make test    build and pass the tests (ctest), plus the sanitizer/fuzz build
#   make bench   build and run the benchmarks (bench/), writing bench/results/*.json
#   make mutants plant the mutants of tests/mutants.txt one at a time in a copy of the
#                tree (build-mutants/), run the tests each should fail, print the killed
#                share; writes bench/results/mutants-<date>.json (docs/testing.md)
#   make clean   remove the build folders

BUILD      ?= build
ASAN_BUILD ?= build-asan
EMU_BUILD  ?= build-emu
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
CTEST_ARGS ?=

.PHONY: all build deps-train deps-test deps-bench train test test-main test-emu test-asan bench mutants clean

all: build

# Explicit rules: make skips pattern rules for .PHONY targets, so a `deps-%:` rule never ran.
deps-train deps-test deps-bench:
	@scripts/install-deps $(@:deps-%=%)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

# The quickstart: ResNet34 on Fashion-MNIST, 2 ranks on the CPU (one per GPU where there
# are GPUs); it ends with the test accuracy and where the logs are.
train: deps-train
	@$(MAKE) --no-print-directory build
	./$(BUILD)/ringtrain train configs/quickstart.yaml

# The main build (with the CUDA backend where the toolkit is present; GPU tests skip
# without a device), then the emulated-GPU build (the whole CUDA program on the emulated
# CUDA runtime, cuDNN, cuBLAS and NCCL of tests/cuda_emu: its GPU tests must run, not
# skip), then a clang build with AddressSanitizer + UBSan that runs the unit and fuzz
# tests again.
test: deps-test
	@$(MAKE) --no-print-directory test-main
	@$(MAKE) --no-print-directory test-emu
	@$(MAKE) --no-print-directory test-asan

test-main: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) $(CTEST_ARGS)

test-emu:
	@test -f $(EMU_BUILD)/CMakeCache.txt || cmake -S . -B $(EMU_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DRINGTRAIN_CUDA=EMU $(CMAKE_ARGS)
	cmake --build $(EMU_BUILD) -j$(JOBS)
	cd $(EMU_BUILD) && RINGTRAIN_REQUIRE_GPU=1 ctest --output-on-failure -j$(JOBS) -L 'gpu|emu' $(CTEST_ARGS)

test-asan:
	@test -f $(ASAN_BUILD)/CMakeCache.txt || CC=clang cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug \
	    -DRINGTRAIN_CUDA=OFF -DRINGTRAIN_SANITIZE=address,undefined -DRINGTRAIN_FUZZ=ON $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j$(JOBS) -L 'unit|fuzz' $(CTEST_ARGS)

bench: deps-bench
	@$(MAKE) --no-print-directory build
	bench/run

# not part of `make test`: tens of minutes (one rebuild and test run per mutant)
MUTANTS_ARGS ?=
mutants: deps-test
	scripts/mutants --jobs $(JOBS) $(MUTANTS_ARGS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(EMU_BUILD) build-mutants
