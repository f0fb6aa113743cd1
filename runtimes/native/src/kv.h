// kv.h - the KV-cache contract's bookkeeping in C++ (a line-by-line port of edge_spec/contract/kv.py's pure functions and
// KVState): layout, masks, slots, sliding rings, commit / rewind, and the `state` binding's written rows.
//
// Positions are absolute; the runtime (KVState) owns the position counter, each slot's position, the masks and
// commit / rewind. Graphs keep no hidden counters.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "contract_names.h"

namespace es {

extern const char* const FULL;     // "full"
extern const char* const SLIDING;  // "sliding"
using contract::BINDING_IO;      // kv.py's bindings (contract_names.h)
using contract::BINDING_STATE;
using contract::BINDING_SHARED;  // caches in and out bound to the same buffers (kv.py)
using contract::SHARED_SPARE_SLOTS;  // a `shared` pass writes a dummy row one slot past its own
using contract::SCORE_EDGE;          // onnxruntime's attention scoring sums long heads otherwise past it (kv.py)
using contract::SCORE_K_BLOCK;
bool writes_all(const std::string& binding);  // every row of a pass lands in the caches (state, shared)
constexpr float NEG_INF = -1e30f;  // finite: a fully masked row never turns into NaN

struct CacheSpec {
  int layer = 0;
  std::string kind;  // FULL | SLIDING
  int num_kv_heads = 0;
  int head_dim = 0;
  int slots = 0;   // S_l
  int window = 0;  // 0: full attention
};

struct KVLayout {
  std::vector<CacheSpec> caches;
  int max_context = 0;
  int max_pass = 0;  // most new tokens per forward; 0: no cap
  std::string binding = BINDING_IO;

  std::vector<std::string> kinds() const;  // sorted, unique
  int slots(const std::string& kind) const;
  int window(const std::string& kind) const;  // 0: full attention
};

// An additive mask [rows, cols] row-major (the graph input is [1, 1, rows, cols]).
struct Mask {
  int rows = 0, cols = 0;
  std::vector<float> data;
  float at(int r, int c) const { return data[size_t(r) * cols + c]; }
};
using Masks = std::map<std::string, Mask>;  // kind -> mask

int ring_slots(int window, int max_context, int max_pass, const std::string& binding);
void check_pass(const KVLayout& layout, int n_new);
// The most tokens a verify pass after n_cached committed ones may carry and have each row scored as its decode step
// scores it (0: any): `shared` layouts with heads longer than SCORE_K_BLOCK, while a decode step scores <= SCORE_EDGE
// keys (kv.py pass_cap).
int pass_cap(const KVLayout& layout, int64_t n_cached, int min_rows);
int drafter_window(int window);  // W + 2 (0 stays 0)
// slot_pos: [S] (-1 empty); queries at positions q0 .. q0 + n - 1 -> [n, S + n].
Mask attention_mask(const std::vector<int64_t>& slot_pos, int64_t q0, int n, int window);
int bucket_slots(int need, int slots, int bucket);
// (rows, slot ids) for committing positions start .. start + n - 1.
std::pair<std::vector<int64_t>, std::vector<int64_t>> commit_slots(int64_t start, int n, int slots, bool ring);

using CommitPlan = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>>;

class KVState {
 public:
  explicit KVState(KVLayout layout);

  const KVLayout& layout() const { return layout_; }
  int64_t length = 0;  // committed positions = the position of the next token to commit
  std::map<std::string, std::vector<int64_t>> slot_pos;  // kind -> [S] position held by each slot (-1 empty)
  std::map<std::string, int64_t> retained_from;          // kind -> positions [retained_from, length) still held

  void check_fits(int n_new) const;
  Masks masks(int n_new) const;    // kind -> [T, S_kind + T]
  Masks drafter_masks() const;     // kind -> [1, S_kind]
  void written(int n);             // `state` binding: a forward wrote n rows at [length, length + n)
  CommitPlan plan_commit(int n) const;
  void advance(int n, const CommitPlan& plan);
  void rewind(int64_t pos);
  void reset();

 private:
  std::vector<int64_t> committed(const std::string& kind) const;
  void check_window(int key_offset, const char* reader) const;  // reads W + key_offset keys back
  KVLayout layout_;
};

}  // namespace es
