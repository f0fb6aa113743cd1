// datastore.cpp - see datastore.h; the definition and the file layout: edge_spec/decoding/datastore.py.
//
// File (little-endian): "ESDSTORE", uint32 version, min_n, max_n, k_max, min_share, vocab_size, n_tokens, n_index
// (40 bytes); tokens uint32[n_tokens]; index uint32[n_index].
#include "datastore.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "errors.h"

namespace es {

namespace {

constexpr uint32_t SEP = 0xFFFFFFFFu;  // between documents; above every token id
constexpr uint32_t VERSION = 1;
constexpr int MAX_WINDOW = 64;
constexpr size_t HEADER = 40;
const char* const REBUILD = "re-export the bundle (edge-spec export) so that its datastore.bin is rebuilt, or pass "
                            "--no-datastore";

uint32_t u32(const std::string& data, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | uint32_t(uint8_t(data[at + size_t(i)]));
  return v;
}

}  // namespace

std::unique_ptr<Datastore> Datastore::load(const std::string& path, int64_t vocab_size) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw bundle_error("cannot read the datastore " + path, REBUILD);
  const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (data.size() < HEADER)
    throw bundle_error(path + " is " + std::to_string(data.size()) + " bytes, shorter than its 40-byte header", REBUILD);
  if (data.compare(0, 8, "ESDSTORE") != 0) throw bundle_error(path + " is not an edge-spec datastore", REBUILD);
  const uint32_t version = u32(data, 8);
  if (version != VERSION)
    throw bundle_error(path + " is datastore version " + std::to_string(version) + ", this runner reads version 1",
                       std::string("update the runner, or ") + REBUILD);
  std::unique_ptr<Datastore> d(new Datastore());
  d->min_n_ = int(u32(data, 12)), d->max_n_ = int(u32(data, 16)), d->k_max_ = int(u32(data, 20));
  d->min_share_ = int(u32(data, 24));
  d->vocab_ = int64_t(u32(data, 28));
  const uint64_t n_tokens = u32(data, 32), n_index = u32(data, 36);
  if (!(1 <= d->min_n_ && d->min_n_ <= d->max_n_ && d->k_max_ >= 1 && d->max_n_ + d->k_max_ <= MAX_WINDOW) ||
      d->min_share_ > 100 || d->vocab_ < 1)
    throw bundle_error(path + ": n-gram lengths, k_max, min_share or vocab_size out of range (corrupt)", REBUILD);
  if (d->vocab_ != vocab_size)
    throw bundle_error(path + " was built for a vocabulary of " + std::to_string(d->vocab_) + ", the target's is " +
                           std::to_string(vocab_size), REBUILD);
  if (data.size() != HEADER + 4 * (n_tokens + n_index))
    throw bundle_error(path + " is " + std::to_string(data.size()) + " bytes, its header says " +
                           std::to_string(HEADER + 4 * (n_tokens + n_index)) + " (truncated or altered)", REBUILD);
  d->tokens_.resize(n_tokens);
  d->index_.resize(n_index);
  for (size_t i = 0; i < n_tokens; ++i) d->tokens_[i] = u32(data, HEADER + 4 * i);
  for (size_t i = 0; i < n_index; ++i) d->index_[i] = u32(data, HEADER + 4 * (n_tokens + i));
  d->check(path);
  d->starts_.assign(size_t(d->vocab_) + 1, 0);  // counting sort of the windows' first tokens
  for (uint32_t p : d->index_) d->starts_[size_t(d->tokens_[p]) + 1] += 1;
  for (size_t t = 1; t < d->starts_.size(); ++t) d->starts_[t] += d->starts_[t - 1];
  return d;
}

void Datastore::check(const std::string& where) const {
  if (!tokens_.empty() && tokens_.back() != SEP)
    throw bundle_error(where + ": the text does not end with a separator (corrupt)", REBUILD);
  size_t real = 0;
  for (uint32_t t : tokens_) {
    if (t == SEP) continue;
    if (int64_t(t) >= vocab_) throw bundle_error(where + ": a token id is >= its vocabulary size (corrupt)", REBUILD);
    ++real;
  }
  std::vector<bool> seen(tokens_.size(), false);
  bool ok = index_.size() == real;
  for (size_t i = 0; ok && i < index_.size(); ++i) {
    const uint32_t p = index_[i];
    ok = p < tokens_.size() && tokens_[p] != SEP && !seen[p];
    if (ok) seen[p] = true;
  }
  if (!ok) throw bundle_error(where + ": the index does not list every text position exactly once (corrupt)", REBUILD);
  const size_t window = size_t(max_n_ + k_max_);
  for (size_t i = 1; i < index_.size(); ++i) {  // neighbours' windows in order (each cut at its first SEP)
    for (size_t j = 0; j < window; ++j) {
      const uint32_t a = at(i - 1, j), b = at(i, j);
      if (a < b) break;
      if (a > b) throw bundle_error(where + ": the index is not sorted by window (corrupt)", REBUILD);
      if (a == SEP) break;  // both windows end here: equal
    }
  }
}

std::pair<size_t, size_t> Datastore::narrow(size_t lo, size_t hi, size_t offset, uint32_t token) const {
  // the windows in [lo, hi) agree before `offset` (no SEP there) and are sorted by their token at it
  size_t a = lo, b = hi;
  while (a < b) {  // first with token at offset >= token
    const size_t mid = a + (b - a) / 2;
    if (at(mid, offset) < token) a = mid + 1;
    else b = mid;
  }
  size_t c = a, e = hi;
  while (c < e) {  // first with token at offset > token
    const size_t mid = c + (e - c) / 2;
    if (at(mid, offset) <= token) c = mid + 1;
    else e = mid;
  }
  return {a, c};
}

std::pair<size_t, size_t> Datastore::occurrences(const int64_t* pattern, int n) const {
  if (pattern[0] < 0 || pattern[0] >= vocab_) return {0, 0};
  size_t lo = starts_[size_t(pattern[0])], hi = starts_[size_t(pattern[0]) + 1];
  for (int j = 1; j < n && lo < hi; ++j) {
    if (pattern[j] < 0 || pattern[j] >= vocab_) return {0, 0};
    std::tie(lo, hi) = narrow(lo, hi, size_t(j), uint32_t(pattern[j]));
  }
  return {lo, hi};
}

std::vector<int64_t> Datastore::propose(const std::vector<int64_t>& context, int k) const {
  // the match: n grows while context[-n:] occurs followed by a token (SEP sorts last: the run's first one tells)
  int n = 0;
  size_t lo = 0, hi = 0;
  for (int m = min_n_; m <= std::min(max_n_, int(context.size())); ++m) {
    auto run = occurrences(context.data() + context.size() - size_t(m), m);
    if (run.first == run.second || at(run.first, size_t(m)) == SEP) break;
    n = m, lo = run.first, hi = run.second;
  }
  std::vector<int64_t> draft;
  while (n && int(draft.size()) < std::min(k, k_max_)) {
    const size_t offset = size_t(n) + draft.size();
    size_t best_from = 0, best_count = 0;
    for (size_t i = lo; i < hi;) {  // runs of equal next tokens, ascending; SEP (a document's end) last
      const uint32_t t = at(i, offset);
      if (t == SEP) break;
      size_t j = i + 1;
      while (j < hi && at(j, offset) == t) ++j;
      if (j - i > best_count) best_from = i, best_count = j - i;  // strictly more: ties keep the lowest id
      i = j;
    }
    if (!best_count || 100 * best_count < size_t(min_share_) * (hi - lo)) break;
    draft.push_back(int64_t(at(best_from, offset)));
    lo = best_from, hi = best_from + best_count;
  }
  return draft;
}

std::unique_ptr<Datastore> open_bundle_datastore(const std::string& folder, const Manifest& m) {
  const Json& entry = m.raw.get("datastore");
  if (entry.is_null()) return nullptr;
  const char* fix = "re-run `edge-spec export` into a fresh --out folder (manifest.json was edited or damaged)";
  if (!entry.is_object() || !entry.get("file").is_string())
    throw bundle_error(folder + "/manifest.json: datastore is not an object with a \"file\"", fix);
  const std::string& rel = entry.at("file").as_string();
  if (!m.files.count(rel))
    throw bundle_error(folder + "/manifest.json: datastore.file " + rel + " is used but has no checksum entry", fix);
  const Json& version = entry.get("version");
  if (!version.is_number() || version.as_number() != double(VERSION))
    throw bundle_error(folder + "/manifest.json: datastore version " + version.dump() + ", this runner reads version 1",
                       "update the runner, or re-export the bundle with --no-datastore");
  return Datastore::load(folder + "/" + rel, m.vocab_size);
}

}  // namespace es
