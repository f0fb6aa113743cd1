#!/usr/bin/env bash
# fetch_ort_headers.sh DEST - onnxruntime's C/C++ headers into DEST/include (CMakeLists.txt runs it when they are
# missing; `make native` and tests/test_native*.py reach it through CMake).
#
# The onnxruntime PyPI wheel (what the Python runtime and the native runner link against: its capi/libonnxruntime.so)
# ships no headers. The npm package com.github.asus4.onnxruntime@0.4.9 (onnxruntime's Unity plugin) carries them
# (ORT_API_VERSION 29) in its iOS framework; they are platform-neutral C/C++ and the wheel's newer library serves
# API version 29 (GetApi is backward compatible). The tarball is pinned by sha256; only Headers/ is kept (the tarball
# is ~150 MB: its other platforms' libraries are not used and it is deleted after extraction).
set -euo pipefail
PACKAGE="com.github.asus4.onnxruntime@0.4.9"
SHA256="e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d"
HEADERS="package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers"

DEST="${1:?usage: fetch_ort_headers.sh DEST}"
if [ -f "$DEST/include/onnxruntime_cxx_api.h" ]; then exit 0; fi
command -v npm >/dev/null || {
  echo "error: npm is needed to fetch onnxruntime's C/C++ headers ($PACKAGE) for the native runner's onnx backend" >&2
  echo "  fix: apt-get install npm, or pass -DORT_INCLUDE_DIR=<folder with onnxruntime_cxx_api.h>," \
       "or build the executorch-only runner with -DES_WITH_ORT=OFF" >&2
  exit 2
}
mkdir -p "$DEST"
WORK="$(mktemp -d "$DEST/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
TGZ="$(ls "$WORK"/*.tgz)"
GOT="$(sha256sum "$TGZ" | cut -d' ' -f1)"
if [ "$GOT" != "$SHA256" ]; then
  echo "error: $PACKAGE's tarball has sha256 $GOT, expected $SHA256 (not the pinned package)" >&2
  echo "  fix: check the npm registry / proxy, or pass -DORT_INCLUDE_DIR=<onnxruntime headers of API version >= 29>" >&2
  exit 2
fi
tar xzf "$TGZ" -C "$WORK" "$HEADERS"
rm -rf "$DEST/include"
mv "$WORK/$HEADERS" "$DEST/include"
echo "$PACKAGE sha256 $SHA256" > "$DEST/SOURCE"
