// qnn_fixed.h - the fixed-shape pieces of the qnn backend (qnn_backend.cpp), ports of runtimes/fixed.py's helpers:
// the shapes the manifest records (pass lengths, graph cache slots, the SoC, the mask floor, the host sink), one
// opened graph with its IO checked against what the backend feeds, and the placed form's per-kind feeds.
//
// Include only where ES_HAVE_ORT is defined.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kv.h"
#include "manifest.h"
#include "ort_common.h"
#include "qnn_ep.h"

namespace es {
namespace qnn {

extern const char* const FIX;      // re-export the bundle: edge-spec export --format qnn --out DIR
extern const char* const QNN_DIR;  // "qnn": the graphs are qnn/<graph>.qdq.onnx and qnn/<graph>.ctx.onnx

// runtimes/fixed.py fixed_shapes + runtimes/qnn.py open_bundle: what graphs.target.fixed holds.
struct FixedShapes {
  std::map<int, std::string> lengths;  // pass length n -> graph name ("target_<n>")
  std::map<std::string, int> slots;    // kind -> the graphs' cache slots S_f
  QnnSoc soc;
  std::string quant, sink;             // sink: the host's float graph of position 0, bundle-relative ("": none)
  float mask_floor = NEG_INF;
  // --qnn-position0 table (runtimes/qnn_htp.py position0_file): position 0's rows precomputed for these first tokens
  // in this bundle-relative file ("": none); a bundle without QDQ graphs (cpu_graphs false) runs on the HTP only
  std::string position0;
  std::vector<int64_t> position0_tokens;
  bool cpu_graphs = true;
};

// Throws Error(Code::Bundle) naming the manifest when a field is missing or does not fit the layout.
FixedShapes fixed_shapes(const std::string& folder, const Manifest& m);

// One opened graph: its session, file, pass length and IO as onnxruntime reports it.
struct Graph {
  Ort::Session session{nullptr};
  std::string path;
  int n = 1;  // pass length (the drafter step: 1)
  ort::SessionIO io;
};

struct Want {  // one input or output as the backend feeds / reads it
  std::string name;
  ONNXTensorElementDataType type;
  std::vector<int64_t> shape;
};

// The graph takes exactly `inputs` and gives exactly `outputs` (any order; a symbolic dim matches any size), else
// Error(Code::Bundle) naming the file and the tensor.
void check_io(const Graph& g, const std::vector<Want>& inputs, const std::vector<Want>& outputs);

// runtimes/qnn.py open_session: one graph file of the bundle on a provider, checked before use.
struct Opener {
  std::shared_ptr<Ort::Env> env;
  std::string folder, provider;  // provider: "qnn" | "cpu" (the target's and drafter's)
  int threads = 0;               // 0: onnxruntime's default
  QnnSoc soc;
  std::vector<Ort::ConstEpDevice> devices;  // the QNN EP's (provider qnn)

  // `rel` (bundle-relative) on `on`: "qnn" - the HTP only (CPU fallback disabled, every node placed on the QNN EP), or
  // Error(Code::Bundle) saying what would run elsewhere; "cpu" - onnxruntime's CPU provider. n: the pass length.
  Graph open(const std::string& rel, const std::string& on, int n) const;
};

// "qnn" | "cpu": `given` (--provider), else $EDGE_SPEC_QNN_PROVIDER, else "qnn"; anything else Error(Code::Argument).
std::string provider_of(const std::string& given);

// What a target graph of length n takes and gives under `shapes` (runtimes/fixed.py FixedBackend.feeds, exporters/qnn.py).
std::vector<Want> target_inputs(const KVLayout& layout, const FixedShapes& shapes, int n);
// aux: an eagle3 bundle's AUX_HIDDEN width (0: none).
std::vector<Want> target_outputs(const KVLayout& layout, int n, int vocab, int hidden, int aux = 0);

// What the drafter step graph takes and gives (kv.drafter_io without tables, ids int32); sources: kind -> cache index.
std::vector<Want> drafter_inputs(const KVLayout& layout, const FixedShapes& shapes,
                                 const std::vector<std::pair<std::string, size_t>>& sources, int64_t hidden);
std::vector<Want> drafter_outputs(int64_t candidates, int64_t hidden);

// What an eagle3 drafter's step graph of length n takes and gives (kv.eagle3_drafter_io, ids int32) over its own cache
// layout `draft` (S = draft.max_context slots), and its fc graph (kv.eagle3_fc_io): exporters/qnn.py _eagle3_graphs.
std::vector<Want> eagle3_step_inputs(const KVLayout& draft, int n, int64_t hidden);
std::vector<Want> eagle3_step_outputs(const KVLayout& draft, int n, int64_t hidden, int64_t draft_vocab);
std::vector<Want> eagle3_fc_inputs(int n, int64_t aux_width);
std::vector<Want> eagle3_fc_outputs(int n, int64_t hidden);

// runtimes/fixed.py slot_feeds: the contract's mask of one kind [t, s + t] (t = positions.size()) as the graph's slot
// mask [n, s_f] (slot j of real row r: the new row's column where this pass writes slot j, else the cache column;
// slots [s, s_f) masked; pad rows: the last real row's view; masked entries `floor`), `keep` [n, s_f] (1 where the
// mask is 0) and the slot index [s_f] (j, or s_f + r where row r writes slot j: position % s in a ring, else the
// position).
void slot_feeds(const Mask& m, const std::vector<int64_t>& positions, int n, int s, int s_f, bool ring, float floor,
                float* mask, float* keep, int32_t* index);

}  // namespace qnn
}  // namespace es
