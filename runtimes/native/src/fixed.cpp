// fixed.cpp - see fixed.h; every function mirrors its namesake in runtimes/fixed.py (same names, same refusals).
#include "fixed.h"

#include <algorithm>
#include <cstring>

#include "contract_names.h"
#include "errors.h"

namespace es {

namespace {

bool is_int_text(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

int positive_int(const Json& j, const std::string& what, const std::string& where, const std::string& fix) {
  if (!j.is_number() || j.as_number() < 1 || j.as_number() != double(int64_t(j.as_number())) || j.as_number() > 1e8)
    throw bundle_error(where + ": " + what + " is " + j.dump() + ", not a positive integer", fix);
  return int(j.as_int());
}

std::vector<std::string> names(const Json& fixed, const char* key, const std::string& where, const std::string& fix) {
  if (!fixed.get(key).is_array())
    throw bundle_error(where + ": the `state` target entry has no fixed." + key + " list", fix);
  std::vector<std::string> out;
  for (const auto& n : fixed.at(key).as_array()) {
    if (!n.is_string()) throw bundle_error(where + ": fixed." + key + " holds " + n.dump() + ", not a name", fix);
    out.push_back(n.as_string());
  }
  return out;
}

// Row r of `mask` restricted to columns [c0, c0 + n), each raised to `floor` (np.maximum(mask, floor)).
void copy_row(const Mask& mask, int r, int c0, int n, float floor, float* dst) {
  const float* row = mask.data.data() + size_t(r) * mask.cols + c0;
  for (int j = 0; j < n; ++j) dst[j] = std::max(row[j], floor);
}

void check_mask(const Mask& mask, int t, int s, const char* who) {
  if (t < 1 || mask.rows != t || mask.cols != s + t || mask.data.size() != size_t(t) * size_t(s + t))
    throw kv_state_error(std::string(who) + ": a mask of " + std::to_string(mask.rows) + " x " +
                             std::to_string(mask.cols) + " for " + std::to_string(t) + " rows over " +
                             std::to_string(s) + " slots",
                         "pass the KV state's masks for this pass (KVState::masks)");
}

}  // namespace

std::string feature_name(const std::string& contract_name) {
  std::string out = contract_name;
  std::replace(out.begin(), out.end(), '.', '_');
  return out;
}

std::string write_slots_name(const std::string& kind) { return "write_slots." + kind; }

std::map<std::string, int> state_slots(const KVLayout& layout) {
  std::map<std::string, int> out;
  for (const auto& kind : layout.kinds())
    out[kind] = (layout.slots(kind) + 1 + STATE_ALIGN - 1) / STATE_ALIGN * STATE_ALIGN;
  return out;
}

int FixedShapes::length_for(int t, const std::string& fix) const {
  auto it = lengths.lower_bound(t);
  if (it == lengths.end())
    throw config_error("one forward over " + std::to_string(t) + " tokens exceeds this bundle's longest graph (" +
                           std::to_string(longest()) + " tokens)",
                       "use a smaller --spec-k, or " + fix);
  return it->first;
}

FixedShapes fixed_shapes(const Json& fixed, const KVLayout& layout, const std::string& what, const std::string& where,
                         const std::string& fix) {
  if (!fixed.is_object() || !fixed.get("lengths").is_object() || fixed.at("lengths").as_object().empty())
    throw bundle_error(where + ": the target entry lists no fixed pass lengths", fix);
  if (!fixed.get("slots").is_object()) throw bundle_error(where + ": the target entry lists no fixed cache slots", fix);
  FixedShapes out;
  for (const auto& entry : fixed.at("lengths").as_object()) {
    if (!is_int_text(entry.first) || std::stoll(entry.first) < 1 || std::stoll(entry.first) > 1000000 ||
        !entry.second.is_string())
      throw bundle_error(where + ": fixed.lengths entry '" + entry.first + "': " + entry.second.dump() +
                             " is not a pass length and its entry point",
                         fix);
    out.lengths[int(std::stoll(entry.first))] = entry.second.as_string();
  }
  for (const auto& entry : fixed.at("slots").as_object())
    out.slots[entry.first] = positive_int(entry.second, "fixed.slots." + entry.first, where, fix);
  const bool state = layout.binding == BINDING_STATE;
  const std::map<std::string, int> aligned = state ? state_slots(layout) : std::map<std::string, int>();
  for (const auto& c : layout.caches) {
    if (!out.slots.count(c.kind))
      throw bundle_error(where + ": fixed.slots has no '" + c.kind + "' entry (layer " + std::to_string(c.layer) + ")",
                         fix);
    const int s_f = out.slots.at(c.kind);
    const int expected = state ? aligned.at(c.kind) : c.slots;
    if (c.window && expected != s_f)
      throw config_error("this " + what + "'s rings hold " + std::to_string(s_f) + " slots; a layout of " +
                             std::to_string(c.slots) + " cannot run on its fixed shapes",
                         "load it with its exported --max-context");
    if (s_f < c.slots + (state ? 1 : 0))
      throw bundle_error(where + ": fixed.slots." + c.kind + " is " + std::to_string(s_f) + ", fewer than the " +
                             std::to_string(c.slots) + (state ? " slots + the spare one" : " slots") +
                             " of the layout's " + c.kind + " layers",
                         fix);
  }
  if (state) {
    out.inputs = names(fixed, "inputs", where, fix);
    out.states = names(fixed, "states", where, fix);
  }
  return out;
}

int64_t fixed_dim(const std::string& dim, int t, const std::map<std::string, int>& slots) {
  const size_t plus = dim.find('+');
  if (plus != std::string::npos)
    return fixed_dim(dim.substr(0, plus), t, slots) + fixed_dim(dim.substr(plus + 1), t, slots);
  if (is_int_text(dim)) return std::stoll(dim);
  const std::string slots_prefix = contract::slots_dim("");  // "S_<kind>"
  if (dim == contract::T_DIM) return t;
  if (dim.compare(0, slots_prefix.size(), slots_prefix) == 0 && slots.count(dim.substr(slots_prefix.size())))
    return slots.at(dim.substr(slots_prefix.size()));
  throw bundle_error("the manifest dim '" + dim + "' is not one a fixed-shape graph has (T, S_<kind>, a number)",
                     "re-export the bundle with this edge-spec");
}

std::map<int, std::string> entry_lengths(const Manifest& m, const std::string& entry, const std::string& where,
                                         const std::string& fix) {
  std::map<int, std::string> out;
  try {
    const Json& fixed = m.raw.at("graphs").at(entry).get("fixed");
    if (fixed.is_object() && fixed.has("lengths"))
      for (const auto& e : fixed.at("lengths").as_object()) out[std::stoi(e.first)] = e.second.as_string();
  } catch (const std::exception& err) {
    throw bundle_error(where + ": graphs." + entry + ".fixed is malformed (" + err.what() + ")", fix);
  }
  if (out.empty()) throw bundle_error(where + ": the '" + entry + "' entry lists no fixed lengths", fix);
  return out;
}

std::vector<int64_t> fixed_dims(const TensorSpec& spec, int t, const std::map<std::string, int>& slots) {
  std::vector<int64_t> out;
  for (const auto& d : spec.shape) out.push_back(fixed_dim(d, t, slots));
  return out;
}

std::vector<int32_t> pad_ids(const std::vector<int64_t>& ids, int n) {
  std::vector<int32_t> out(ids.begin(), ids.end());
  out.resize(size_t(n), int32_t(ids.back()));
  return out;
}

std::vector<int32_t> pad_positions(const std::vector<int64_t>& positions, int n) {
  std::vector<int32_t> out(positions.begin(), positions.end());
  for (int64_t next = positions.back() + 1; out.size() < size_t(n); ++next) out.push_back(int32_t(next));
  return out;
}

std::vector<float> pad_mask(const Mask& mask, int n, int s, int s_f, float floor) {
  const int t = mask.rows;
  check_mask(mask, t, s, "pad_mask");
  const int cols = s_f + n;
  std::vector<float> out(size_t(n) * cols, floor);
  for (int r = 0; r < t; ++r) {
    copy_row(mask, r, 0, s, floor, out.data() + size_t(r) * cols);       // cache slots [0, s)
    copy_row(mask, r, s, t, floor, out.data() + size_t(r) * cols + s_f);  // new rows [s_f, s_f + t)
  }
  for (int r = t; r < n; ++r)  // pad rows: the last real row's view
    std::memcpy(out.data() + size_t(r) * cols, out.data() + size_t(t - 1) * cols, sizeof(float) * size_t(cols));
  return out;
}

SlotFeeds slot_feeds(const Mask& mask, const std::vector<int64_t>& positions, int n, int s, int s_f, bool ring,
                     float floor) {
  const int t = int(positions.size());
  check_mask(mask, t, s, "slot_feeds");
  std::vector<int64_t> slots(positions);
  for (auto& p : slots) {
    p = ring ? p % s : p;
    if (p < 0 || p >= s_f)
      throw kv_state_error("slot_feeds: position " + std::to_string(p) + " has no slot among " + std::to_string(s_f),
                           "pass positions inside the layout's context");
  }
  SlotFeeds out;
  out.mask.assign(size_t(n) * s_f, floor);
  for (int r = 0; r < t; ++r) {
    float* row = out.mask.data() + size_t(r) * s_f;
    copy_row(mask, r, 0, s, floor, row);
    for (int j = 0; j < t; ++j) row[slots[size_t(j)]] = std::max(mask.at(r, s + j), floor);  // numpy: the last wins
  }
  for (int r = t; r < n; ++r)
    std::memcpy(out.mask.data() + size_t(r) * s_f, out.mask.data() + size_t(t - 1) * s_f, sizeof(float) * size_t(s_f));
  out.index.resize(size_t(s_f));
  for (int j = 0; j < s_f; ++j) out.index[size_t(j)] = j;
  for (int r = 0; r < t; ++r) out.index[size_t(slots[size_t(r)])] = s_f + r;
  return out;
}

std::vector<int32_t> write_slots(const std::vector<int64_t>& positions, int n, int s, int s_f, bool ring) {
  std::vector<int32_t> out(size_t(n), s_f - 1);
  for (size_t i = 0; i < positions.size(); ++i) out[i] = int32_t(ring ? positions[i] % s : positions[i]);
  return out;
}

std::vector<float> drafter_mask(const Mask& mask, int s, int s_f, float floor) {
  if (mask.rows != 1 || mask.cols < s)
    throw kv_state_error("drafter_mask: a mask of " + std::to_string(mask.rows) + " x " + std::to_string(mask.cols) +
                             " for " + std::to_string(s) + " slots",
                         "pass the KV state's drafter masks (KVState::drafter_masks)");
  std::vector<float> out(size_t(s_f), floor);
  copy_row(mask, 0, 0, s, floor, out.data());
  return out;
}

FixedPass plan_pass(const FixedShapes& shapes, const KVLayout& layout, const std::vector<int64_t>& ids,
                    const std::vector<int64_t>& positions, const Masks& masks, float floor, const std::string& fix) {
  FixedPass p;
  p.t = int(ids.size());
  if (p.t < 1 || positions.size() != ids.size())
    throw kv_state_error("a fixed-shape pass of " + std::to_string(ids.size()) + " ids at " +
                             std::to_string(positions.size()) + " positions",
                         "pass one position per id (Session::forward)");
  p.n = shapes.length_for(p.t, fix);
  p.function = shapes.lengths.at(p.n);
  p.ids = pad_ids(ids, p.n);
  p.positions = pad_positions(positions, p.n);
  const bool state = layout.binding == BINDING_STATE;
  for (const auto& kind : layout.kinds()) {
    const int s = layout.slots(kind), s_f = shapes.slots.at(kind);
    const bool ring = layout.window(kind) != 0;
    if (state) {
      p.masks[kind] = slot_feeds(masks.at(kind), positions, p.n, s, s_f, ring, floor).mask;
      p.write_slots[kind] = write_slots(positions, p.n, s, s_f, ring);
    } else {
      p.masks[kind] = pad_mask(masks.at(kind), p.n, s, s_f, floor);
    }
  }
  return p;
}

FixedCaches::FixedCaches(const KVLayout& layout, const std::map<std::string, int>& slots) : layout_(layout) {
  for (const auto& c : layout.caches) {
    slots_.push_back(slots.at(c.kind));
    const size_t n = size_t(c.num_kv_heads) * size_t(slots_.back()) * size_t(c.head_dim);
    k_.emplace_back(n, 0.0f);
    v_.emplace_back(n, 0.0f);
  }
}

std::vector<int64_t> FixedCaches::shape(size_t i) const {
  const CacheSpec& c = layout_.caches[i];
  return {1, c.num_kv_heads, slots_[i], c.head_dim};
}

void FixedCaches::commit(const CommitPlan& plan, const std::vector<std::vector<float>>& new_k,
                         const std::vector<std::vector<float>>& new_v, int t) {
  for (size_t i = 0; i < layout_.caches.size(); ++i) {
    const CacheSpec& c = layout_.caches[i];
    const auto& rows = plan.at(c.kind).first;
    const auto& slots = plan.at(c.kind).second;
    const size_t d = size_t(c.head_dim), s_f = size_t(slots_[i]), h_n = size_t(c.num_kv_heads);
    if (new_k[i].size() != h_n * size_t(t) * d || new_v[i].size() != new_k[i].size())
      throw kv_state_error("commit: layer " + std::to_string(c.layer) + "'s new rows hold " +
                               std::to_string(new_k[i].size()) + " values, not [" + std::to_string(h_n) + ", " +
                               std::to_string(t) + ", " + std::to_string(d) + "]",
                           "commit the rows of the last forward");
    for (size_t j = 0; j < rows.size(); ++j)
      if (rows[j] < 0 || rows[j] >= t || slots[j] < 0 || size_t(slots[j]) >= s_f)
        throw kv_state_error("commit: row " + std::to_string(rows[j]) + " -> slot " + std::to_string(slots[j]) +
                                 " is outside a pass of " + std::to_string(t) + " rows over " + std::to_string(s_f) +
                                 " slots",
                             "commit at most the rows of the last forward (KVState::plan_commit)");
    for (size_t h = 0; h < h_n; ++h)  // k[:, h, slots[j]] = new[:, h, rows[j]]
      for (size_t j = 0; j < rows.size(); ++j) {
        const size_t src = (h * size_t(t) + size_t(rows[j])) * d, dst = (h * s_f + size_t(slots[j])) * d;
        std::memcpy(k_[i].data() + dst, new_k[i].data() + src, d * sizeof(float));
        std::memcpy(v_[i].data() + dst, new_v[i].data() + src, d * sizeof(float));
      }
  }
}

}  // namespace es
