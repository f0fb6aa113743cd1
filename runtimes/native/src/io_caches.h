// io_caches.h - the onnx backend's caches (ort_backend.cpp), a port of runtimes/io_caches.py IoCaches: the `io`
// binding's runner-held caches, per cached layer a flat K and V buffer [H_kv * S * D] bound as its bucket's prefix
// [1, H_kv, b, D] (b a multiple of the bucket size, grown and shrunk as the visible slots need), the accepted rows of
// a pass copied into their slots at commit. Format-neutral (no onnxruntime in it).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "kv.h"

namespace es {

// A float buffer whose pages become resident only when written (io_caches.py lazy_zeros): a private anonymous
// mapping, zero-filled by the OS, huge pages off. std::vector<float>(n, 0.0f) writes every page up front: SmolLM2's
// caches at 2,048 slots are 94 MB, of which a chat turn uses a few.
class ZeroPages {
 public:
  explicit ZeroPages(size_t floats);
  ~ZeroPages();
  ZeroPages(ZeroPages&& other) noexcept;
  ZeroPages(const ZeroPages&) = delete;
  ZeroPages& operator=(const ZeroPages&) = delete;
  ZeroPages& operator=(ZeroPages&&) = delete;
  float* data() { return data_; }
  size_t size() const { return floats_; }

 private:
  float* data_ = nullptr;
  size_t floats_ = 0, bytes_ = 0;
};

class IoCaches {
 public:
  // spare: slots past each layer's own that a pass may write (`shared`: its dummy row, SHARED_SPARE_SLOTS)
  IoCaches(const KVLayout& layout, int bucket, int spare);

  int bucket(const std::string& kind) const { return bucket_.at(kind); }
  int generation() const { return generation_; }
  float* k(size_t i) { return k_[i].data(); }  // [1, H_kv, b, D] with b = bucket(kind)
  float* v(size_t i) { return v_[i].data(); }

  // Before a pass over t tokens after n_cached committed ones: buckets holding every visible key and the slots the
  // pass writes (io_caches.py IoCaches.prepare).
  void prepare(int64_t n_cached, int t);

  // Copy the accepted rows of the last pass (new rows [1, H_kv, t, D] per layer) into their slots. `in_place`
  // (`shared`): the graph already wrote them there; a re-layout keeps them and nothing is copied.
  void commit(const CommitPlan& plan, const std::vector<std::vector<float>>& k_new,
              const std::vector<std::vector<float>>& v_new, int t, bool in_place);

 private:
  // Make the bound prefix of `kind` the bucket for `need` visible slots, keeping rows [0, used) of every head.
  void fit(const std::string& kind, int used, int need);
  // Head h's rows move from offset h * old * D to h * new * D (in place; the order never overwrites unread rows).
  static void relayout(float* flat, const CacheSpec& c, int old_b, int new_b, int rows);

  KVLayout layout_;
  int bucket_size_, spare_;
  std::vector<ZeroPages> k_, v_;
  std::map<std::string, int> bucket_, used_;  // kind -> slots bound; rows [0, used) of each bucket hold data
  int generation_ = 0;
};

}  // namespace es
