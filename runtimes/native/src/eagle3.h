// eagle3.h - an EAGLE-3 drafter's bookkeeping, format-neutral (no runtime's types): the target's aux states by
// position (AuxRecord, runtimes/ort_eagle3.py AuxRecord) and which rows each draft step runs and which of them stay
// committed (Eagle3Rows, the begin / step logic of runtimes/ort_eagle3.py OrtEagle3Drafter, itself the ONNX twin of
// runtimes/torch_eagle3.py TorchEagle3Drafter). A backend runs the fc and step graphs over what `next` says and
// reports back with `wrote` (ort_backend.cpp: onnx bundles).
//
// Unlike an MTP drafter, an EAGLE-3 drafter owns a KV cache. Its row at position p pairs the target's aux states at
// p - 1 with token p (slot p - 1), so after the target commits positions [0, L) (token L pending) its rows 1..L are
// final. Each burst:
//   begin(L)     keep the committed rows whose tokens 0..p all still agree with the target's (a rewind or a new
//                prompt drops the rest, also when only token 0 differs: every row's aux states read it);
//   first step   run the missing rows c + 1..L in one pass (target aux [c, L) through the fc graph, tokens
//                c + 1..L), commit them: row L's output is the first draft;
//   later steps  one chained row each (the previous row's hidden, the draft token), written after the committed rows
//                but not committed: the next burst starts from the committed length again, which drops them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace es {

// The target's tokens and aux states by position: ids [S] (-1: none yet), aux [S, width] (S: the target's
// max_context). Every target pass records its rows (rejected drafts and dummy rows too: a later pass over the same
// position overwrites them, so a committed position keeps the values of the pass that committed it).
struct AuxRecord {
  AuxRecord(int max_context, int width);
  void record(const int64_t* ids, const int64_t* positions, const float* aux, int t);  // aux [t, width]
  const float* aux_rows(int64_t from) const { return aux.data() + size_t(from) * size_t(width); }
  int width;
  std::vector<int64_t> ids;
  std::vector<float> aux;
};

class Eagle3Rows {
 public:
  // capacity: the drafter cache's slots (the target's max_context + 1)
  Eagle3Rows(const AuxRecord& record, int capacity);

  // A burst after the target's committed positions [0, position).
  void begin(int64_t position);

  // The rows of the next step: `first` (the burst's first step): ids = target tokens c + 1..L - 1 and `token`, whose
  // hidden is the fc graph over the target's aux rows [aux_from, aux_from + ids.size()); else ids = {token}, hidden
  // the previous step's. The rows land at positions s + 1..s + T (slots s..s + T - 1), after the s written ones.
  struct Rows {
    bool first = false;
    int64_t s = 0, aux_from = 0;
    std::vector<int64_t> ids;
  };
  Rows next(int64_t token);
  // After the graph ran `rows` and its new K/V rows were written into slots s..s + T - 1.
  void wrote(const Rows& rows);

  // A step that would write past the drafter cache's `slots` rows: Error(Code::KvState) with the fix (never with the
  // loop's draft lengths, which stop at max_context).
  static void check_room(const Rows& rows, int64_t slots);
  // The graph calls of one step, after check_room: a first step's rows `chunk` at a time (the whole step when
  // chunk <= 0), fuse(aux_from, n) then run(ids, n, s) per chunk, in order (each chunk's rows written before the next
  // reads them); a chained step: chain() (the previous step's hidden becomes the input) then run(ids, 1, s).
  template <typename Fuse, typename Chain, typename Run>
  static void drive(const Rows& rows, int chunk, Fuse&& fuse, Chain&& chain, Run&& run) {
    const int t = int(rows.ids.size());
    if (!rows.first) {
      chain();
      run(rows.ids.data(), t, rows.s);
      return;
    }
    if (chunk <= 0) chunk = t;
    for (int a = 0; a < t; a += chunk) {
      const int n = t - a < chunk ? t - a : chunk;
      fuse(rows.aux_from + a, n);
      run(rows.ids.data() + a, n, rows.s + a);
    }
  }

  int64_t committed() const { return committed_; }
  int64_t used() const { return used_; }

 private:
  const AuxRecord& record_;
  std::vector<int64_t> tokens_;  // the token at each position when its row was computed (-1: none)
  int64_t committed_ = 0;        // rows 1..committed are final (slots 0..committed - 1)
  int64_t used_ = 0;             // rows written this burst (committed + chained)
  int64_t position_ = 0;
  bool fresh_ = false;
};

}  // namespace es
