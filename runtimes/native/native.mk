# runtimes/native/native.mk - `make native`: the C++ runner (libedge_spec.so, edge-spec-run, c_api_test) built with
# CMake into build/native against the executorch and onnxruntime wheels that `make venv` installs. One download:
# onnxruntime's C/C++ headers (the wheel has none), which CMake fetches with npm into build/native/onnxruntime-headers
# on the first configure (scripts/fetch_ort_headers.sh, sha256-pinned); without npm the runner is built for executorch
# bundles only and CMake's warning names the fix (NATIVE_CMAKE_ARGS=-DES_WITH_ORT=ON makes that an error instead).
# Included by the top Makefile, which defines VENV, BIN and the `venv` target.
#
#   make native                 configure + build (Release, 2 jobs: NATIVE_JOBS=N to change)
#   make native-test            build, then the native runner's tests (tiny bundles; tests/test_native.py,
#                               tests/test_native_ort.py, tests/test_native_qnn.py, tests/test_native_hardening.py
#                               and tests/test_bench_native.py: edge-spec bench --runtime native); the oracle-drafter
#                               tests run edge-spec-run-test, the CLI built with the test hooks beside edge-spec-run
NATIVE_BUILD ?= build/native
NATIVE_JOBS  ?= 2
NATIVE_CMAKE_ARGS ?=

.PHONY: native native-test

native: venv
	@command -v cmake >/dev/null && command -v c++ >/dev/null || { \
	  echo "error: cmake and a C++17 compiler are needed for the native runner"; \
	  echo "  fix: apt-get install cmake g++ (Debian/Ubuntu), or $(BIN)/pip install cmake"; exit 2; }
	cmake -S runtimes/native -B $(NATIVE_BUILD) -DCMAKE_BUILD_TYPE=Release -DES_PYTHON=$(abspath $(BIN))/python $(NATIVE_CMAKE_ARGS)
	cmake --build $(NATIVE_BUILD) -j$(NATIVE_JOBS)
	@echo "native runner: $(NATIVE_BUILD)/edge-spec-run, bundle formats: $$(cat $(NATIVE_BUILD)/formats.txt)"

native-test: native
	$(BIN)/python -m pytest -q tests/test_native.py tests/test_native_ort.py tests/test_native_qnn.py \
	  tests/test_native_hardening.py tests/test_bench_native.py tests/test_contract_header.py -m "not real"
