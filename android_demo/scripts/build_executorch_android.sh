#!/usr/bin/env bash
# build_executorch_android.sh - ExecuTorch's C++ runtime for Android (arm64-v8a), built from source with the NDK and
# installed into a prefix that app/src/main/cpp/CMakeLists.txt reads (find_package(executorch)). Run by the Gradle
# task :app:buildExecuTorch when the prefix is missing; runs on the developer's machine only (git clone of the
# sources + submodules at build time; nothing is downloaded on the phone).
#
#   ANDROID_NDK=$ANDROID_HOME/ndk/27.2.12479018 android_demo/scripts/build_executorch_android.sh
#
# Env:
#   ANDROID_NDK                 (required) the NDK; Gradle passes android.ndkDirectory
#   ANDROID_ABI                 arm64-v8a (default)
#   EXECUTORCH_COMMIT           3b60683923245cf472b7323426920e15623ba361 = the git_version of the executorch==1.5.1
#                               wheel that `edge-spec export` uses (same runtime as the exporter; .pte compatible)
#   EXECUTORCH_SRC              where the sources go (default android_demo/third-party/executorch-src)
#   EXECUTORCH_ANDROID_PREFIX   install prefix (default android_demo/third-party/executorch-android/$ANDROID_ABI)
#   PYTHON_EXECUTABLE           a Python with torch (torchgen) + pyyaml for ExecuTorch's kernel codegen; the
#                               edge-spec venv has both (default: ../.venv/bin/python, else python3)
#   QNN_SDK_ROOT                set: also build the Qualcomm QNN delegate (then build the app with -Pedgespec.qnn=true)
#   JOBS                        parallel jobs (default: nproc)
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
ABI="${ANDROID_ABI:-arm64-v8a}"
COMMIT="${EXECUTORCH_COMMIT:-3b60683923245cf472b7323426920e15623ba361}"
REPO="${EXECUTORCH_REPO:-https://github.com/pytorch/executorch.git}"
SRC="${EXECUTORCH_SRC:-$HERE/third-party/executorch-src}"
PREFIX="${EXECUTORCH_ANDROID_PREFIX:-$HERE/third-party/executorch-android/$ABI}"
JOBS="${JOBS:-$(nproc 2>/dev/null || sysctl -n hw.ncpu)}"
QNN="${QNN_SDK_ROOT:-}"
PY="${PYTHON_EXECUTABLE:-}"
if [ -z "$PY" ]; then
  if [ -x "$HERE/../.venv/bin/python" ]; then PY="$HERE/../.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
: "${ANDROID_NDK:?set ANDROID_NDK to the NDK folder (e.g. \$ANDROID_HOME/ndk/27.2.12479018)}"
[ -f "$ANDROID_NDK/build/cmake/android.toolchain.cmake" ] || { echo "error: no NDK at $ANDROID_NDK" >&2; exit 2; }
for tool in git cmake; do command -v "$tool" >/dev/null || { echo "error: $tool not found" >&2; exit 2; }; done

# 1. sources at the pinned commit, with submodules (XNNPACK, flatbuffers, flatcc, pthreadpool, cpuinfo, ...)
if [ ! -d "$SRC/.git" ]; then
  git clone --filter=blob:none "$REPO" "$SRC"
fi
if [ "$(git -C "$SRC" rev-parse HEAD)" != "$COMMIT" ]; then
  git -C "$SRC" fetch origin "$COMMIT" || git -C "$SRC" fetch origin
  git -C "$SRC" checkout --detach "$COMMIT"
fi
git -C "$SRC" submodule sync --recursive
git -C "$SRC" submodule update --init --recursive

# 2. configure with ExecuTorch's Android preset, minus what the runner does not use: no JNI layer of its own (this
#    app has its own bridge; the preset's JNI would fetch fbjni), no LLM extension/runner, no training, and no LLM
#    custom kernels (the runner registers llama::update_cache_with_indices itself: a second registration aborts).
QNN_FLAGS=(-DEXECUTORCH_BUILD_QNN=OFF)
if [ -n "$QNN" ]; then QNN_FLAGS=(-DEXECUTORCH_BUILD_QNN=ON -DQNN_SDK_ROOT="$QNN"); fi
BUILD="$SRC/cmake-out-android-$ABI"
(cd "$SRC" && cmake --preset "android-$ABI" -B "$BUILD" \
  -DCMAKE_TOOLCHAIN_FILE="$ANDROID_NDK/build/cmake/android.toolchain.cmake" \
  -DANDROID_ABI="$ABI" -DANDROID_PLATFORM=android-26 -DANDROID_STL=c++_shared \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" -DPYTHON_EXECUTABLE="$PY" \
  -DEXECUTORCH_BUILD_ANDROID_JNI=OFF -DEXECUTORCH_BUILD_LLAMA_JNI=OFF \
  -DEXECUTORCH_BUILD_EXTENSION_LLM=OFF -DEXECUTORCH_BUILD_EXTENSION_LLM_RUNNER=OFF \
  -DEXECUTORCH_BUILD_EXTENSION_ASR_RUNNER=OFF -DEXECUTORCH_BUILD_EXTENSION_TRAINING=OFF \
  -DEXECUTORCH_BUILD_KERNELS_LLM=OFF -DEXECUTORCH_BUILD_DEVTOOLS=OFF -DEXECUTORCH_ENABLE_EVENT_TRACER=OFF \
  -DEXECUTORCH_BUILD_XNNPACK=ON -DEXECUTORCH_BUILD_KERNELS_OPTIMIZED=ON -DEXECUTORCH_BUILD_KERNELS_QUANTIZED=ON \
  -DEXECUTORCH_BUILD_EXTENSION_MODULE=ON -DEXECUTORCH_BUILD_EXTENSION_DATA_LOADER=ON \
  -DEXECUTORCH_BUILD_EXTENSION_FLAT_TENSOR=ON -DEXECUTORCH_BUILD_EXTENSION_TENSOR=ON \
  -DEXECUTORCH_BUILD_EXTENSION_NAMED_DATA_MAP=ON -DEXECUTORCH_BUILD_EXTENSION_RUNNER_UTIL=ON \
  -DFLATCC_ALLOW_WERROR=OFF "${QNN_FLAGS[@]}")

# 3. build + install (static libraries, headers, lib/cmake/ExecuTorch/executorch-config.cmake)
cmake --build "$BUILD" -j"$JOBS" --target install --config Release
echo "ExecuTorch for $ABI installed in $PREFIX"
