// kv.cpp - see kv.h; every function mirrors its namesake in edge_spec/contract/kv.py (same names, same refusals).
#include "kv.h"

#include <algorithm>
#include <set>

#include "errors.h"

namespace es {

const char* const FULL = "full";
const char* const SLIDING = "sliding";

bool writes_all(const std::string& binding) { return binding == BINDING_STATE || binding == BINDING_SHARED; }

std::vector<std::string> KVLayout::kinds() const {
  std::set<std::string> s;
  for (const auto& c : caches) s.insert(c.kind);
  return {s.begin(), s.end()};
}

int KVLayout::slots(const std::string& kind) const {
  for (const auto& c : caches)
    if (c.kind == kind) return c.slots;
  throw config_error("the KV layout has no " + kind + " layer");
}

int KVLayout::window(const std::string& kind) const {
  for (const auto& c : caches)
    if (c.kind == kind) return c.window;
  throw config_error("the KV layout has no " + kind + " layer");
}

int ring_slots(int window, int max_context, int max_pass, const std::string& binding) {
  if (binding == BINDING_SHARED) return max_context;  // slot == position: no ring (kv.py ring_slots)
  if (binding == BINDING_STATE) {
    if (max_pass <= 0) throw config_error("a `state` layout needs a cap on the tokens per pass (max_pass)");
    return std::min(window + max_pass, max_context);
  }
  return std::min(window + std::max(2, max_pass) - 1, max_context);
}

int pass_cap(const KVLayout& layout, int64_t n_cached, int min_rows) {
  if (layout.binding != BINDING_SHARED) return 0;
  bool long_heads = false;
  for (const auto& c : layout.caches) long_heads |= c.head_dim > SCORE_K_BLOCK;
  if (!long_heads || n_cached + min_rows + SHARED_SPARE_SLOTS > SCORE_EDGE) return 0;
  return int(SCORE_EDGE - SHARED_SPARE_SLOTS - min_rows + 1 - n_cached);  // the last row's step: <= SCORE_EDGE keys
}

void check_pass(const KVLayout& layout, int n_new) {
  if (layout.max_pass > 0 && n_new > layout.max_pass)
    throw config_error("one forward over " + std::to_string(n_new) + " tokens exceeds this bundle's limit of " +
                           std::to_string(layout.max_pass) +
                           " tokens per pass (its sliding-window rings are sized for it)",
                       "use --spec-k " + std::to_string(layout.max_pass - 1) +
                           " or less (prefill is chunked automatically), or re-export with --max-pass " +
                           std::to_string(n_new));
}

int drafter_window(int window) { return window == 0 ? 0 : window + 2; }

Mask attention_mask(const std::vector<int64_t>& slot_pos, int64_t q0, int n, int window) {
  const int s = int(slot_pos.size());
  Mask m;
  m.rows = n;
  m.cols = s + n;
  m.data.assign(size_t(m.rows) * m.cols, NEG_INF);
  for (int t = 0; t < n; ++t) {
    const int64_t q = q0 + t;
    float* row = m.data.data() + size_t(t) * m.cols;
    for (int j = 0; j < s; ++j) {  // cache slots
      const int64_t dist = q - slot_pos[j];
      bool visible = slot_pos[j] >= 0 && dist >= 0 && (window == 0 || dist < window);
      if (visible) row[j] = 0.0f;
    }
    for (int j = 0; j < n; ++j) {  // the new rows (consecutive positions)
      const int64_t dist = t - j;
      bool visible = dist >= 0 && (window == 0 || dist < window);
      if (visible) row[s + j] = 0.0f;
    }
  }
  return m;
}

int bucket_slots(int need, int slots, int bucket) {
  int up = need <= 0 ? 0 : (need + bucket - 1) / bucket * bucket;
  return std::min(slots, std::max(bucket, up));
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> commit_slots(int64_t start, int n, int slots, bool ring) {
  std::vector<int64_t> rows, ids;
  const int first = (ring && n > slots) ? n - slots : 0;
  for (int r = first; r < n; ++r) {
    rows.push_back(r);
    const int64_t pos = start + r;
    ids.push_back(ring ? pos % slots : pos);
  }
  return {rows, ids};
}

KVState::KVState(KVLayout layout) : layout_(std::move(layout)) { reset(); }

void KVState::check_fits(int n_new) const {
  if (length + n_new > layout_.max_context)
    throw context_error("context overflow: " + std::to_string(length) + " cached + " + std::to_string(n_new) +
                            " new tokens > max context " + std::to_string(layout_.max_context),
                        "shorten the prompt, lower max_new_tokens, or load with a larger max_context");
}

std::vector<int64_t> KVState::committed(const std::string& kind) const {
  std::vector<int64_t> sp = slot_pos.at(kind);
  if (writes_all(layout_.binding))
    for (auto& p : sp)
      if (p >= length) p = -1;  // rows written but not committed (rejected drafts) are shown empty
  return sp;
}

void KVState::check_window(int key_offset, const char* reader) const {
  for (const auto& kind : layout_.kinds()) {
    const int window = layout_.window(kind);
    if (window == 0) continue;
    const int64_t from = std::max<int64_t>(0, length - (window + key_offset));
    if (from < retained_from.at(kind))
      throw kv_state_error(std::string(reader) + " at position " + std::to_string(length) + " reads the " + kind +
                               " ring back to position " + std::to_string(from) + ", but its " +
                               std::to_string(layout_.slots(kind)) + " slots were overwritten up to position " +
                               std::to_string(retained_from.at(kind) - 1) +
                               " (rows written past the committed ones)",
                           "re-export with rings sized by kv.ring_slots for this binding and --max-pass, or reset "
                           "the session");
  }
}

Masks KVState::masks(int n_new) const {
  check_fits(n_new);
  check_pass(layout_, n_new);
  check_window(-1, "this pass");
  Masks out;
  for (const auto& kind : layout_.kinds()) out[kind] = attention_mask(committed(kind), length, n_new, layout_.window(kind));
  return out;
}

Masks KVState::drafter_masks() const {
  check_window(+1, "the drafter");
  Masks out;
  for (const auto& kind : layout_.kinds()) {
    Mask full = attention_mask(committed(kind), length, 1, drafter_window(layout_.window(kind)));
    Mask m;  // [1, S_kind]: the cache slots only
    m.rows = 1;
    m.cols = layout_.slots(kind);
    m.data.assign(full.data.begin(), full.data.begin() + m.cols);
    out[kind] = std::move(m);
  }
  return out;
}

void KVState::written(int n) {
  for (const auto& kind : layout_.kinds()) {
    const bool ring = layout_.window(kind) != 0;
    const int s = layout_.slots(kind);
    auto plan = commit_slots(length, n, s, ring);
    auto& sp = slot_pos[kind];
    for (size_t i = 0; i < plan.first.size(); ++i) sp[plan.second[i]] = length + plan.first[i];
    if (ring) retained_from[kind] = std::max(retained_from[kind], length + n - s);
  }
}

CommitPlan KVState::plan_commit(int n) const {
  check_fits(n);
  CommitPlan plan;
  for (const auto& kind : layout_.kinds())
    plan[kind] = commit_slots(length, n, layout_.slots(kind), layout_.window(kind) != 0);
  return plan;
}

void KVState::advance(int n, const CommitPlan& plan) {
  for (const auto& entry : plan) {
    auto& sp = slot_pos[entry.first];
    for (size_t i = 0; i < entry.second.first.size(); ++i) sp[entry.second.second[i]] = length + entry.second.first[i];
  }
  length += n;
  for (auto& r : retained_from) r.second = std::max<int64_t>(r.second, length - layout_.slots(r.first));
}

void KVState::rewind(int64_t pos) {
  if (pos < 0 || pos > length)
    throw kv_state_error("cannot rewind to position " + std::to_string(pos) + ": the cache holds positions [0, " +
                             std::to_string(length) + ")",
                         "rewind to a position between 0 and the current length");
  for (const auto& kind : layout_.kinds()) {
    const int window = layout_.window(kind);
    if (window == 0) continue;
    const int64_t needed_from = std::max<int64_t>(0, pos - window + 1);
    if (needed_from < retained_from.at(kind))
      throw kv_state_error("cannot rewind to position " + std::to_string(pos) + ": the " + kind + " ring (" +
                               std::to_string(layout_.slots(kind)) + " slots) already evicted position " +
                               std::to_string(needed_from) + ", which a query at " + std::to_string(pos) +
                               " must see",
                           "re-prefill the prompt from scratch (session.reset()) instead of rewinding this far");
  }
  for (auto& entry : slot_pos)
    for (auto& p : entry.second)
      if (p >= pos) p = -1;
  length = pos;
}

void KVState::reset() {
  length = 0;
  slot_pos.clear();
  retained_from.clear();
  for (const auto& kind : layout_.kinds()) {
    slot_pos[kind].assign(size_t(layout_.slots(kind)), -1);
    retained_from[kind] = 0;
  }
}

}  // namespace es
