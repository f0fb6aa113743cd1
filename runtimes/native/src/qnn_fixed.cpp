// qnn_fixed.cpp - see qnn_fixed.h. Compiled only with ES_HAVE_ORT (an empty file otherwise).
#ifdef ES_HAVE_ORT
#include "qnn_fixed.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "contract_names.h"
#include "errors.h"
#include "qnn_backend.h"

namespace es {

using namespace contract;  // the graph IO names and formats (contract_names.h, generated)
namespace qnn {

const char* const FIX = "re-export the bundle: edge-spec export --format qnn --out DIR";
const char* const QNN_DIR = "qnn";

namespace {
const ONNXTensorElementDataType F32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, I32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
}  // namespace

// ---- the manifest's fixed shapes (runtimes/fixed.py fixed_shapes, runtimes/qnn.py open_bundle) ----------------------
FixedShapes fixed_shapes(const std::string& folder, const Manifest& m) {
  const std::string where = join_path(folder, MANIFEST_FILE);
  const Json& fixed = m.raw.at("graphs").at("target").get("fixed");
  if (!fixed.is_object() || !fixed.has("lengths") || !fixed.has("slots") || !fixed.get("qnn").is_object())
    throw bundle_error(where + ": the qnn target entry lists no fixed pass lengths or SoC", FIX);
  FixedShapes f;
  try {
    for (const auto& e : fixed.at("lengths").as_object()) f.lengths[std::stoi(e.first)] = e.second.as_string();
    for (const auto& e : fixed.at("slots").as_object()) f.slots[e.first] = int(e.second.as_int());
    const Json& q = fixed.at("qnn");
    f.soc = QnnSoc{q.at("soc").as_string(), int(q.at("soc_model").as_int()), int(q.at("htp_arch").as_int())};
    f.quant = q.at("quant").as_string();
    f.mask_floor = float(q.at("mask_floor").as_number());
    if (!q.get("host_sink").is_null()) f.sink = q.at("host_sink").as_string();
    if (q.get("position0").is_object()) {
      f.position0 = q.at("position0").at("file").as_string();
      for (const auto& t : q.at("position0").at("tokens").as_array()) f.position0_tokens.push_back(t.as_int());
    }
    if (q.has("cpu_graphs")) f.cpu_graphs = q.at("cpu_graphs").as_bool();
  } catch (const std::exception& err) {  // JsonError, or a length that is not a number
    throw bundle_error(where + ": graphs.target.fixed is malformed (" + err.what() + ")", FIX);
  }
  for (const auto& kind : m.layout.kinds())
    if (!f.slots.count(kind) || f.slots.at(kind) < m.layout.slots(kind))
      throw bundle_error(where + ": graphs.target.fixed.slots has no room for the '" + kind + "' caches", FIX);
  for (const auto& c : m.layout.caches)  // rings cannot shrink: their slot count is the graphs' modulus
    if (c.window && f.slots.at(c.kind) != c.slots)
      throw config_error("this QNN bundle's rings hold " + std::to_string(f.slots.at(c.kind)) + " slots; a layout of " +
                             std::to_string(c.slots) + " cannot run on its fixed shapes",
                         "load it with its exported --max-context");
  if (f.lengths.empty()) throw bundle_error(where + ": graphs.target.fixed.lengths is empty", FIX);
  return f;
}

// ---- one graph's IO --------------------------------------------------------------------------------------------
void check_io(const Graph& g, const std::vector<Want>& inputs, const std::vector<Want>& outputs) {
  for (int pass = 0; pass < 2; ++pass) {
    const auto& want = pass == 0 ? inputs : outputs;
    const auto& got = pass == 0 ? g.io.inputs : g.io.outputs;
    const std::string role = pass == 0 ? "input" : "output";
    std::string names;
    for (const auto& w : want) names += (names.empty() ? "" : ", ") + w.name;
    if (got.size() != want.size())
      throw bundle_error(g.path + ": the graph has " + std::to_string(got.size()) + " " + role + "s, this runner feeds " +
                             std::to_string(want.size()) + " [" + names + "]",
                         FIX);
    for (const auto& w : want) {
      if (!got.count(w.name))
        throw bundle_error(g.path + ": the graph has no " + role + " " + w.name + " (expected [" + names + "])", FIX);
      const ort::TensorInfo& info = got.at(w.name);
      bool same = info.type == w.type && info.shape.size() == w.shape.size();
      for (size_t i = 0; same && i < w.shape.size(); ++i) same = info.shape[i] == w.shape[i] || info.shape[i] < 0;
      if (!same)
        throw bundle_error(g.path + ": graph " + role + " " + w.name + " is " + ort::type_name(info.type) +
                               ort::shape_text(info.shape) + ", the manifest's fixed shapes make it " +
                               ort::type_name(w.type) + ort::shape_text(w.shape),
                           FIX);
    }
  }
}

// ---- opening a graph -------------------------------------------------------------------------------------------
Graph Opener::open(const std::string& rel, const std::string& on, int n) const {
  Graph g;
  g.path = join_path(folder, rel);
  g.n = n;
  struct stat st;
  if (::stat(g.path.c_str(), &st) != 0) throw bundle_error(g.path + " is missing from the bundle", FIX);
  if (on == "qnn") {
    Ort::SessionOptions so = qnn_session_options(*env, devices, soc, threads);
    const std::string path = g.path, soc_name = soc.name;
    g.session = ort::open_session(*env, g.path, so, FIX, [&](const std::string& what) {
      if (what.find("fallback to CPU EP has been explicitly disabled") != std::string::npos)
        throw bundle_error(path + ": part of the graph would run outside the HTP (" + soc_name + ")",
                           "re-export for this SoC, or run it with --provider cpu");
    });
    const std::vector<std::string> off = off_htp_nodes(g.session);
    if (!off.empty()) {
      std::string list;
      for (size_t i = 0; i < off.size() && i < 5; ++i) list += (i ? ", " : "") + off[i];
      throw bundle_error(g.path + ": " + std::to_string(off.size()) + " node(s) placed off the HTP: " + list, FIX);
    }
  } else {
    Ort::SessionOptions so;
    so.SetLogSeverityLevel(3);
    if (threads > 0) so.SetIntraOpNumThreads(threads);
    g.session = ort::open_session(*env, g.path, so, FIX);
  }
  g.io = ort::session_io(g.session);
  return g;
}

std::string provider_of(const std::string& given) {
  const char* env = std::getenv(QNN_PROVIDER_ENV);
  const std::string p = !given.empty() ? given : env && *env ? env : "qnn";
  if (p != "qnn" && p != "cpu")
    throw config_error("the qnn runtime has no provider '" + p + "'" +
                           (given.empty() ? std::string(" (from $") + QNN_PROVIDER_ENV + ")" : ""),
                       "use --provider qnn (the HTP) or --provider cpu (the QDQ reference on the CPU)");
  return p;
}

// ---- what the graphs take and give ------------------------------------------------------------------------------
std::vector<Want> target_inputs(const KVLayout& layout, const FixedShapes& shapes, int n) {
  std::vector<Want> in = {{INPUT_IDS, I32, {1, n}}, {POSITION_IDS, I32, {1, n}}};
  for (const auto& kind : layout.kinds()) {
    const int64_t s_f = shapes.slots.at(kind);
    in.push_back({mask_name(kind), F32, {1, 1, n, s_f}});
    in.push_back({"keep." + kind, F32, {1, 1, n, s_f}});
    in.push_back({"slot_index." + kind, I32, {s_f}});
  }
  for (const auto& c : layout.caches)
    for (const std::string& name : {k_cache_name(c.layer), v_cache_name(c.layer)})
      in.push_back({name, F32, {1, c.num_kv_heads, shapes.slots.at(c.kind), c.head_dim}});
  return in;
}

std::vector<Want> target_outputs(const KVLayout& layout, int n, int vocab, int hidden, int aux) {
  std::vector<Want> out = {{LOGITS, F32, {1, n, vocab}}, {HIDDEN, F32, {1, n, hidden}}};
  if (aux) out.push_back({AUX_HIDDEN, F32, {1, n, aux}});
  for (const auto& c : layout.caches)
    for (const std::string& name : {k_new_name(c.layer), v_new_name(c.layer)})
      out.push_back({name, F32, {1, c.num_kv_heads, n, c.head_dim}});
  return out;
}

std::vector<Want> drafter_inputs(const KVLayout& layout, const FixedShapes& shapes,
                                 const std::vector<std::pair<std::string, size_t>>& sources, int64_t hidden) {
  std::vector<Want> in = {{INPUT_IDS, I32, {1, 1}}, {HIDDEN, F32, {1, 1, hidden}}, {POSITION_IDS, I32, {1, 1}}};
  for (const auto& src : sources) {
    const CacheSpec& c = layout.caches[src.second];
    const int64_t s_f = shapes.slots.at(c.kind);
    in.push_back({mask_name(src.first), F32, {1, 1, 1, s_f}});
    for (const std::string& name : {k_cache_name(c.layer), v_cache_name(c.layer)})
      in.push_back({name, F32, {1, c.num_kv_heads, s_f, c.head_dim}});
  }
  return in;
}

std::vector<Want> drafter_outputs(int64_t candidates, int64_t hidden) {
  return {{DRAFT_TOKEN_IDS, I32, {candidates}}, {DRAFT_LOGITS, F32, {candidates}},
          {DRAFT_HIDDEN, F32, {1, 1, hidden}}};
}

std::vector<Want> eagle3_step_inputs(const KVLayout& draft, int n, int64_t hidden) {
  const int64_t s = draft.max_context;
  std::vector<Want> in = {{INPUT_IDS, I32, {1, n}}, {HIDDEN, F32, {1, n, hidden}}, {POSITION_IDS, I32, {1, n}},
                          {DRAFT_MASK, F32, {1, 1, n, s + n}}};
  for (const auto& c : draft.caches) {
    in.push_back({draft_k_cache_name(c.layer), F32, {1, c.num_kv_heads, s, c.head_dim}});
    in.push_back({draft_v_cache_name(c.layer), F32, {1, c.num_kv_heads, s, c.head_dim}});
  }
  return in;
}

std::vector<Want> eagle3_step_outputs(const KVLayout& draft, int n, int64_t hidden, int64_t draft_vocab) {
  std::vector<Want> out = {{DRAFT_TOKEN_IDS, I32, {draft_vocab}}, {DRAFT_LOGITS, F32, {draft_vocab}},
                           {DRAFT_HIDDEN, F32, {1, 1, hidden}}};
  for (const auto& c : draft.caches) {
    out.push_back({draft_k_new_name(c.layer), F32, {1, c.num_kv_heads, n, c.head_dim}});
    out.push_back({draft_v_new_name(c.layer), F32, {1, c.num_kv_heads, n, c.head_dim}});
  }
  return out;
}

std::vector<Want> eagle3_fc_inputs(int n, int64_t aux_width) { return {{AUX_HIDDEN, F32, {1, n, aux_width}}}; }
std::vector<Want> eagle3_fc_outputs(int n, int64_t hidden) { return {{FUSED_HIDDEN, F32, {1, n, hidden}}}; }

// ---- the placed form's feeds ----------------------------------------------------------------------------------
void slot_feeds(const Mask& m, const std::vector<int64_t>& positions, int n, int s, int s_f, bool ring, float floor,
                float* mask, float* keep, int32_t* index) {
  const int t = int(positions.size());
  std::fill(mask, mask + size_t(n) * s_f, floor);
  for (int j = 0; j < s_f; ++j) index[j] = j;
  for (int j = 0; j < t; ++j) index[ring ? positions[j] % s : positions[j]] = s_f + j;
  for (int r = 0; r < t; ++r) {
    float* row = mask + size_t(r) * s_f;
    for (int c = 0; c < s; ++c) row[c] = std::max(m.at(r, c), floor);
    for (int j = 0; j < t; ++j) row[ring ? positions[j] % s : positions[j]] = std::max(m.at(r, s + j), floor);
  }
  for (int r = t; r < n; ++r) std::memcpy(mask + size_t(r) * s_f, mask + size_t(t - 1) * s_f, sizeof(float) * s_f);
  for (size_t i = 0; i < size_t(n) * s_f; ++i) keep[i] = mask[i] == 0.0f ? 1.0f : 0.0f;
}

}  // namespace qnn
}  // namespace es

#endif  // ES_HAVE_ORT
