#!/usr/bin/env bash
# aarch64.sh - cross-build the native runner for aarch64 Linux against the executorch 1.5.1 manylinux_2_28_aarch64
# wheel and run it under qemu-aarch64 (XNNPACK's ARM NEON kernels: the closest to a phone's CPU we can execute here).
#
#   runtimes/native/scripts/aarch64.sh                       # build into build/native-aarch64
#   runtimes/native/scripts/aarch64.sh BUNDLE IDS [FLAGS...]  # build, then run BUNDLE on prompt ids IDS (1,2,3) under
#                                                            # qemu and on x86-64 (build/native), and compare tokens
# Needs (Debian 12): apt-get install g++-aarch64-linux-gnu qemu-user; the wheel is fetched with pip (17 MB).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="$ROOT/build/aarch64"
for tool in aarch64-linux-gnu-g++ aarch64-linux-gnu-gcc qemu-aarch64; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found"; echo "  fix: apt-get install g++-aarch64-linux-gnu qemu-user"; exit 2; }
done
WHEEL="$OUT/wheels/executorch-1.5.1-cp311-cp311-manylinux_2_28_aarch64.whl"
if [ ! -f "$WHEEL" ]; then
  "$PY" -m pip download executorch==1.5.1 --platform manylinux_2_28_aarch64 --only-binary=:all: --no-deps \
      --python-version 3.11 -d "$OUT/wheels"
fi
if [ ! -f "$OUT/et/executorch/version.py" ]; then  # only the C++ runtime: lib/, include/, version.py
  "$PY" - "$WHEEL" "$OUT/et" <<'PYEOF'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(("executorch/lib/", "executorch/include/")) or n == "executorch/version.py"])
PYEOF
fi
cmake -S runtimes/native -B build/native-aarch64 -DCMAKE_BUILD_TYPE=Release -DCMAKE_SYSTEM_NAME=Linux \
    -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
    -DEXECUTORCH_ROOT="$OUT/et/executorch" -DES_WITH_ORT=OFF >/dev/null  # the onnx backend: x86-64 only for now
cmake --build build/native-aarch64 -j2 >/dev/null
echo "built: $(file -b build/native-aarch64/edge-spec-run | cut -d, -f1-2)"
[ $# -ge 2 ] || exit 0
BUNDLE="$1"; IDS="$2"; shift 2
QEMU=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
echo "+ ${QEMU[*]} build/native-aarch64/edge-spec-run --bundle $BUNDLE --check"
"${QEMU[@]}" build/native-aarch64/edge-spec-run --bundle "$BUNDLE" --threads 2 --check
arm=$("${QEMU[@]}" build/native-aarch64/edge-spec-run --bundle "$BUNDLE" --threads 2 --prompt-ids "$IDS" --json "$@")
x86=$(build/native/edge-spec-run --bundle "$BUNDLE" --threads 2 --prompt-ids "$IDS" --json "$@")
tokens() { "$PY" -c 'import json, sys; print(json.loads(sys.argv[1])["tokens"])' "$1"; }
echo "aarch64 (qemu): $(tokens "$arm")"
echo "x86-64:         $(tokens "$x86")"
if [ "$(tokens "$arm")" = "$(tokens "$x86")" ]; then echo "tokens identical"; else echo "tokens DIFFER"; exit 1; fi
