// datastore.h - the static datastore drafter (edge_spec/decoding/datastore.py, the same file and the same drafts):
// the target's own earlier answers as a token text + an index of its positions sorted by their window of
// max_n + k_max tokens, so that every n-gram's occurrences are one run of the index (binary search).
//
// propose(context, k): the largest n in [min_n, max_n] whose suffix context[-n:] occurs followed by a token; then,
// up to min(k, k_max) times, the most frequent next token among the occurrences (lowest id on ties), drafted while
// it holds at least min_share percent of them, the occurrences narrowing to it. The manifest's optional "datastore"
// key names the file (edge_spec/contract/datastore_check.py); bundles without it draft as before.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "manifest.h"

namespace es {

class Datastore {
 public:
  // Reads and checks a datastore.bin (header, sizes, ids < vocab_size, the index a sorted permutation); throws
  // Error(Code::Bundle) naming what is wrong and the fix.
  static std::unique_ptr<Datastore> load(const std::string& path, int64_t vocab_size);
  std::vector<int64_t> propose(const std::vector<int64_t>& context, int k) const;
  int max_n() const { return max_n_; }
  size_t size() const { return tokens_.size(); }

 private:
  std::pair<size_t, size_t> narrow(size_t lo, size_t hi, size_t offset, uint32_t token) const;
  std::pair<size_t, size_t> occurrences(const int64_t* pattern, int n) const;
  uint32_t at(size_t index_pos, size_t offset) const { return tokens_[size_t(index_[index_pos]) + offset]; }
  void check(const std::string& where) const;
  int min_n_ = 2, max_n_ = 8, k_max_ = 8, min_share_ = 50;
  int64_t vocab_ = 0;
  std::vector<uint32_t> tokens_;  // [N] the text, SEP after every document
  std::vector<uint32_t> index_;   // [M] positions sorted by their window
  std::vector<uint32_t> starts_;  // [vocab + 1] the index run of windows starting with token t: starts[t] .. starts[t+1]
};

// The bundle's datastore when its manifest lists one (the "datastore" key), else null.
std::unique_ptr<Datastore> open_bundle_datastore(const std::string& folder, const Manifest& m);

}  // namespace es
