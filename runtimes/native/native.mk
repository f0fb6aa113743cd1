# runtimes/native/native.mk - `make native`: the C++ runner (libedge_spec.so, edge-spec-run, c_api_test) built with
# CMake into build/native against the executorch wheel that `make venv` installs (no other download).
# Included by the top Makefile, which defines VENV, BIN and the `venv` target.
#
#   make native                 configure + build (Release, 2 jobs: NATIVE_JOBS=N to change)
#   make native-test            build, then the native runner's tests (tiny bundles; tests/test_native.py)
NATIVE_BUILD ?= build/native
NATIVE_JOBS  ?= 2

.PHONY: native native-test

native: venv
	@command -v cmake >/dev/null && command -v c++ >/dev/null || { \
	  echo "error: cmake and a C++17 compiler are needed for the native runner"; \
	  echo "  fix: apt-get install cmake g++ (Debian/Ubuntu), or $(BIN)/pip install cmake"; exit 2; }
	cmake -S runtimes/native -B $(NATIVE_BUILD) -DCMAKE_BUILD_TYPE=Release -DES_PYTHON=$(abspath $(BIN))/python
	cmake --build $(NATIVE_BUILD) -j$(NATIVE_JOBS)

native-test: native
	$(BIN)/python -m pytest -q tests/test_native.py -m "not real"
