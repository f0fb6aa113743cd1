#!/usr/bin/env bash
# check_coreml_syntax.sh - what can be checked of the Core ML backend without an Apple SDK: a clang syntax and
# semantic check (-fsyntax-only: parsing, name lookup, types, Objective-C message sends against the declared
# selectors, ARC's rules, blocks) of src/coreml_model.mm and src/coreml_backend.mm as Objective-C++ with ARC, against
# the stand-in Foundation / CoreML declarations in tests/objc/include (NOT Apple's headers: written from the SDK's
# signatures), plus engine.cpp compiled with ES_HAVE_COREML (the path that calls open_coreml). Warnings are errors.
#
#   runtimes/native/tests/objc/check_coreml_syntax.sh [CLANG++] [FILE.mm ...]
#
# Exit 0 when every file passes; the compiler's diagnostics otherwise. CLANG++: clang++, else clang++-19 .. -14
# (Debian: apt-get install clang). FILE.mm: check these instead of the two backend files (the test's negative control
# passes a damaged copy). Not checked here: availability (the target is Linux, so the macOS / iOS availability
# attributes are parsed but not enforced), linking, the real SDK's declarations, running anything.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
native="$(cd "$here/../.." && pwd)"
clang="${1:-}"
if [[ -z "$clang" ]]; then
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
    if command -v "$c" >/dev/null; then clang="$c"; break; fi
  done
fi
if [[ -z "$clang" ]] || ! command -v "$clang" >/dev/null; then
  echo "error: no clang++ found (the check needs clang: gcc has no Objective-C++ with ARC)" >&2
  echo "  fix: apt-get install clang (Debian/Ubuntu), or pass the compiler: $0 /path/to/clang++" >&2
  exit 2
fi
shift || true
files=("$@")
if [[ ${#files[@]} -eq 0 ]]; then files=("$native/src/coreml_model.mm" "$native/src/coreml_backend.mm"); fi
flags=(-std=c++17 -fsyntax-only -Wall -Wextra -Werror -Wno-unused-parameter -DES_HAVE_COREML -DES_HAVE_ORT
       -I "$native/src" -I "$native/include")
for f in "${files[@]}"; do
  "$clang" -x objective-c++ -fobjc-arc -fblocks -fobjc-runtime=macosx-15.0 -isystem "$here/include" "${flags[@]}" "$f"
done
"$clang" -x c++ "${flags[@]}" "$native/src/engine.cpp"
echo "coreml syntax check: ${#files[@]} Objective-C++ file(s) + engine.cpp (ES_HAVE_COREML) pass with $("$clang" --version | head -1)"
