#!/usr/bin/env bash
# build_host.sh - build the Android bridge for the host JVM: the JNI library (android_demo/app/src/main/cpp, host mode:
# the x86-64 runner from runtimes/native against the executorch wheel + the JDK's jni.h) and the Kotlin runner class
# (android_demo/app/src/main/java/dev/edgespec/runner, no android.* import) with the host check (host/BridgeCheck.kt),
# compiled by the npm kotlin-compiler. Everything lands in build/android-host (never committed).
#
#   android_demo/host/build_host.sh           # then run the printed `java ...` line, or tests/test_android_bridge.py
#
# Needs: cmake >= 3.16, g++ (C++17), a JDK 17 (javac + jni.h), npm, and .venv with executorch==1.5.1 (`make venv`).
# Env: PYTHON (default .venv/bin/python), JOBS (2), ES_HOST_OUT (build/android-host), KOTLINC (else npm-installed).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="${ES_HOST_OUT:-$ROOT/build/android-host}"
JOBS="${JOBS:-2}"
KOTLIN_VERSION=2.4.20
KOTLINC="${KOTLINC:-$ROOT/build/kotlin/node_modules/kotlin-compiler/bin/kotlinc}"
mkdir -p "$OUT"

for tool in cmake c++ java; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found (apt-get install cmake g++ openjdk-17-jdk-headless)" >&2; exit 2; }
done
if [ ! -x "$KOTLINC" ]; then
  command -v npm >/dev/null || { echo "error: npm not found (apt-get install npm), needed for kotlin-compiler@$KOTLIN_VERSION" >&2; exit 2; }
  npm install --no-audit --no-fund --prefix "$ROOT/build/kotlin" "kotlin-compiler@$KOTLIN_VERSION" >&2
fi

# 1. the JNI bridge + the runner (C++)
cmake -S android_demo/app/src/main/cpp -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=Release -DES_PYTHON="$PY" >"$OUT/cmake.log"
cmake --build "$OUT/cmake" -j"$JOBS" --target edge_spec_jni >>"$OUT/cmake.log"

# 2. the Kotlin runner class + the host check (skipped when the jar is newer than every source)
JAR="$OUT/bridge-check.jar"
SOURCES=(android_demo/app/src/main/java/dev/edgespec/runner/*.kt android_demo/host/BridgeCheck.kt)
stale=1
if [ -f "$JAR" ]; then
  stale=0
  for src in "${SOURCES[@]}"; do [ "$src" -nt "$JAR" ] && stale=1; done
fi
if [ "$stale" = 1 ]; then
  "$KOTLINC" -jvm-target 17 -nowarn -include-runtime -d "$OUT/bridge-check.tmp.jar" "${SOURCES[@]}" 2>"$OUT/kotlinc.log" \
    || { cat "$OUT/kotlinc.log" >&2; exit 1; }
  mv "$OUT/bridge-check.tmp.jar" "$JAR"
fi
echo "java -Dedgespec.jni.library=$OUT/cmake/libedge_spec_jni.so -cp $JAR dev.edgespec.host.BridgeCheckKt --bundle DIR --ids 5,6,7"
