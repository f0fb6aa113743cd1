// ort_backend.h - the Backend and DrafterBackend over an onnx bundle's `target` and `drafter` graphs (onnxruntime's C++
// API, CPU execution provider). Mirrors runtimes/ort.py + runtimes/io_caches.py: the contract's `io` binding, so the
// runner holds the caches (one flat buffer per cached layer, K and V, viewed as its current bucket [1, H_kv, b, D]),
// feeds them to every pass, receives the pass's new rows as outputs, and copies the accepted rows into their slots
// at commit. The drafter reads the same cache buffers and the bundle's memory-mapped embed table (the target graph
// takes that one copy as its `embed_table` initializer).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "backend.h"
#include "manifest.h"

namespace es {

constexpr int ORT_BUCKET = 64;  // runtimes/io_caches.py BUCKET: cache slots bound per pass are a multiple of this

// Opens target.onnx (+ drafter.onnx) with `threads` intra-op threads (0: onnxruntime's default, one per physical
// core), checks each graph's inputs/outputs against the manifest. Throws Error(Code::Bundle / Code::Backend) naming
// the file and the fix.
std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_ort(const std::string& folder,
                                                                              const Manifest& manifest, int threads);

}  // namespace es
