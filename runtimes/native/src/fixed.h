// fixed.h - fixed-shape graphs: the runtime half every fixed-shape format shares, a port of runtimes/fixed.py
// (Core ML's functions here; Qualcomm's HTP graphs use the same padding). Plain C++, no runtime's types: the Core ML
// backend (coreml_backend.mm) hands these buffers to MLMultiArrays, and tests/fixed_vectors_test.cpp checks every
// function against what runtimes/fixed.py computes (tests/make_fixed_vectors.py), on any platform.
//
// A format exports the target at a few pass lengths (the manifest's target `fixed.lengths`: T -> entry point) over
// caches of a fixed number of slots (`fixed.slots`: kind -> S_f). A pass of t tokens runs the smallest T >= t: rows
// t..T-1 are pad rows (the last token again at the next positions, seeing what the last real row sees; never
// committed or returned). Masks widen from the contract's [t, S + t] to the graph's [T, S_f + T] (`io`) or, for the
// `state` binding (the graph owns the caches), to the slot form [T, S_f] plus the slot each row writes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "json.h"
#include "kv.h"
#include "manifest.h"

namespace es {

std::string feature_name(const std::string& contract_name);  // "k_cache.3" -> "k_cache_3" (kv.feature_name)
std::string write_slots_name(const std::string& kind);       // "write_slots.<kind>" ([T] int32, `state` binding)

constexpr int STATE_ALIGN = 32;  // `state` binding: slots per kind are a multiple of this (fixed.STATE_ALIGN)
// kind -> slots of a `state` program's caches: the layout's plus a spare one (pad rows write there), rounded up.
std::map<std::string, int> state_slots(const KVLayout& layout);

struct FixedShapes {
  std::map<int, std::string> lengths;  // pass length T -> entry point (function / graph name), ascending
  std::map<std::string, int> slots;    // kind -> S_f, the cache slots every graph takes
  std::vector<std::string> inputs;     // `state`: the target functions' feature names, in order (fixed.inputs)
  std::vector<std::string> states;     // `state`: the state names (fixed.states)
  // The smallest exported length >= t; refuses t past the longest (FixedBackend.length_for's words).
  int length_for(int t, const std::string& fix) const;
  int longest() const { return lengths.empty() ? 0 : lengths.rbegin()->first; }
};

// The target entry's `fixed` object checked against `layout` (runtimes/fixed.py fixed_shapes: rings cannot change
// size), plus what a runtime needs before it indexes buffers with these numbers: every kind has S_f >= its slots
// (`state`: > them, the spare slot), lengths > 0, and the `state` lists. `what`: "Core ML package" (the refusal's
// words); `where`: the manifest path; `fix`: how to re-export. Throws Error(Bundle) or Error(Argument).
FixedShapes fixed_shapes(const Json& fixed, const KVLayout& layout, const std::string& what, const std::string& where,
                         const std::string& fix);

// Graph entry `entry`'s fixed.lengths (an eagle3 drafter's "drafter" / "drafter_fc" entries: length -> entry point),
// refused naming `where` and `fix` when missing, empty or malformed.
std::map<int, std::string> entry_lengths(const Manifest& m, const std::string& entry, const std::string& where,
                                         const std::string& fix);

// A manifest dim ("1", "T", "S_full", "S_full+T") of a graph exported at length `t` over `slots`.
int64_t fixed_dim(const std::string& dim, int t, const std::map<std::string, int>& slots);
std::vector<int64_t> fixed_dims(const TensorSpec& spec, int t, const std::map<std::string, int>& slots);

// ---- the padded feeds of one pass (FixedBackend.feeds, its `io` and `state` forms) -------------------------------
std::vector<int32_t> pad_ids(const std::vector<int64_t>& ids, int n);              // [t] -> [n]: the last id again
std::vector<int32_t> pad_positions(const std::vector<int64_t>& positions, int n);  // [t] -> [n]: the next positions
// The contract's mask [t, s + t] as a graph's [n, s_f + n]: real rows keep their columns (cache slots [0, s), new
// rows [s_f, s_f + t)), slots [s, s_f) stay masked, pad rows see what the last real row sees (fixed.pad_mask).
std::vector<float> pad_mask(const Mask& mask, int n, int s, int s_f, float floor);
struct SlotFeeds {
  std::vector<float> mask;     // [n, s_f]
  std::vector<int32_t> index;  // [s_f]: slot j takes row index[j] of cat(cache, new rows) (the placed form's)
};
// The mask [t, s + t] of real rows at `positions` as a slot mask over s_f slots (fixed.slot_feeds).
SlotFeeds slot_feeds(const Mask& mask, const std::vector<int64_t>& positions, int n, int s, int s_f, bool ring,
                     float floor);
// [n] int32: the slot each row writes - position (% s in a ring); pad rows the spare slot s_f - 1 (fixed.write_slots).
std::vector<int32_t> write_slots(const std::vector<int64_t>& positions, int n, int s, int s_f, bool ring);
// A drafter mask [1, s] as the graph's [1, s_f] (the headroom masked; FixedDrafter.begin).
std::vector<float> drafter_mask(const Mask& mask, int s, int s_f, float floor);

struct FixedPass {
  int t = 0, n = 0;                                          // real rows, the graph's length
  std::string function;                                      // its entry point
  std::vector<int32_t> ids, positions;                       // [n]
  std::map<std::string, std::vector<float>> masks;           // kind -> [n, s_f + n] (`io`) | [n, s_f] (`state`)
  std::map<std::string, std::vector<int32_t>> write_slots;   // `state`: kind -> [n]
};
// Every feed of a pass of t = ids.size() tokens at `positions` (the contract's masks: kind -> [t, S + t]).
FixedPass plan_pass(const FixedShapes& shapes, const KVLayout& layout, const std::vector<int64_t>& ids,
                    const std::vector<int64_t>& positions, const Masks& masks, float floor, const std::string& fix);

// ---- the `io` binding's caches, held by the runtime (FixedBackend.k / .v / commit) -------------------------------
class FixedCaches {
 public:
  FixedCaches(const KVLayout& layout, const std::map<std::string, int>& slots);
  float* k(size_t i) { return k_[i].data(); }  // cache i of layout.caches: [1, H_kv, S_f, D]
  float* v(size_t i) { return v_[i].data(); }
  const std::vector<float>& k_data(size_t i) const { return k_[i]; }
  const std::vector<float>& v_data(size_t i) const { return v_[i]; }
  std::vector<int64_t> shape(size_t i) const;  // {1, H_kv, S_f, D}
  // Copy the accepted rows of the last pass into their slots: new_k / new_v [H_kv, t, D] per cache (the pass's
  // real rows), plan: kind -> (rows, slots).
  void commit(const CommitPlan& plan, const std::vector<std::vector<float>>& new_k,
              const std::vector<std::vector<float>>& new_v, int t);

 private:
  KVLayout layout_;
  std::vector<int> slots_;  // S_f per cache
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace es
