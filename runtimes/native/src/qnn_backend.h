// qnn_backend.h - the Backend and DrafterBackend over a qnn bundle's fixed-shape graphs (exporters/qnn.py), a port of
// runtimes/qnn.py + runtimes/fixed.py (FixedBackend / FixedDrafter, the `placed` attention form) over onnxruntime's
// C++ API:
//   * the target is exported at a few pass lengths (manifest graphs.target.fixed.lengths): a pass of t tokens runs
//     the smallest length n >= t, its n - t pad rows repeating the last token at the next positions and seeing what
//     the last real row sees (never committed);
//   * the runner holds the caches ([1, H_kv, S_f, D] float32 per cached layer, S_f = fixed.slots), feeds all of them
//     to every pass and copies the accepted new rows into their slots at commit (`io` binding);
//   * per attention kind a pass takes its mask in slot form [1, 1, n, S_f] (masked entries = fixed.qnn.mask_floor, a
//     quantized graph's calibrated range), `keep` [1, 1, n, S_f] (exactly 1 where the mask is 0) and the slot each
//     row is placed in (`slot_index` [S_f] int32: j, or S_f + r where row r writes slot j);
//   * a pass from position 0 runs that row through the host's float graph (fixed.qnn.host_sink) on the CPU provider
//     and the rest of the pass on the provider, with row 0 in slot 0;
//   * the drafter step graph holds its own tables (constant tables) and reads the target's caches.
// Providers: "qnn" runs the EPContext models (qnn/<graph>.ctx.onnx) on the QNN EP (qnn_ep.h); "cpu" the QDQ models
// (qnn/<graph>.qdq.onnx) on onnxruntime's CPU provider (the quantized graphs' numerical reference).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "backend.h"
#include "manifest.h"

namespace es {

extern const char* const QNN_PROVIDER_ENV;  // EDGE_SPEC_QNN_PROVIDER: qnn | cpu where no option names one (the C API)

struct QnnOptions {
  std::string provider;  // "qnn" | "cpu"; "": $EDGE_SPEC_QNN_PROVIDER, else "qnn" (as the Python runtime)
  std::string ep_library;  // the QNN EP plugin; "": qnn_ep_library's default
};

// Opens the target's graphs (+ the sink, + the drafter) with `threads` intra-op threads (0: onnxruntime's default) and
// checks each graph's inputs and outputs against the fixed shapes the manifest records. Throws Error(Code::Bundle /
// Code::Backend / Code::Argument) naming the file and the fix.
std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_qnn(const std::string& folder,
                                                                              const Manifest& manifest, int threads,
                                                                              const QnnOptions& options);

}  // namespace es
