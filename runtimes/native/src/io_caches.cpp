// io_caches.cpp - see io_caches.h.
#include "io_caches.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace es {

ZeroPages::ZeroPages(size_t floats) : floats_(floats), bytes_(floats * sizeof(float)) {
  if (bytes_ == 0) return;
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_NOHUGEPAGE
  ::madvise(p, bytes_, MADV_NOHUGEPAGE);  // "always" THP would back it with 2 MB pages, resident on first write
#endif
  data_ = static_cast<float*>(p);
}

ZeroPages::~ZeroPages() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
}

ZeroPages::ZeroPages(ZeroPages&& other) noexcept : data_(other.data_), floats_(other.floats_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.floats_ = other.bytes_ = 0;
}

IoCaches::IoCaches(const KVLayout& layout, int bucket, int spare)
    : layout_(layout), bucket_size_(bucket), spare_(spare) {
  for (const auto& c : layout.caches) {
    k_.emplace_back(size_t(c.num_kv_heads) * (c.slots + spare) * c.head_dim);  // zeros, resident when written
    v_.emplace_back(size_t(c.num_kv_heads) * (c.slots + spare) * c.head_dim);
  }
  for (const auto& kind : layout.kinds()) {
    bucket_[kind] = bucket_slots(0, layout.slots(kind) + spare_, bucket_size_);
    used_[kind] = 0;
  }
}

void IoCaches::prepare(int64_t n_cached, int t) {
  for (const auto& kind : layout_.kinds()) {
    const int used = int(std::min<int64_t>(n_cached, layout_.slots(kind)));  // slots >= used are empty
    fit(kind, used, used + t + spare_);
    used_[kind] = used;
  }
}

void IoCaches::commit(const CommitPlan& plan, const std::vector<std::vector<float>>& k_new,
                      const std::vector<std::vector<float>>& v_new, int t, bool in_place) {
  for (const auto& entry : plan) {
    const auto& slots = entry.second.second;
    if (slots.empty()) continue;
    const int top = std::max(used_[entry.first], int(*std::max_element(slots.begin(), slots.end())) + 1);
    fit(entry.first, in_place ? top : used_[entry.first], top);
    used_[entry.first] = top;
  }
  if (in_place) return;
  for (size_t i = 0; i < layout_.caches.size(); ++i) {
    const CacheSpec& c = layout_.caches[i];
    const auto& rows = plan.at(c.kind).first;
    const auto& slots = plan.at(c.kind).second;
    const size_t b = size_t(bucket_.at(c.kind)), d = size_t(c.head_dim);
    for (int h = 0; h < c.num_kv_heads; ++h)
      for (size_t j = 0; j < rows.size(); ++j) {
        const size_t src = (size_t(h) * t + size_t(rows[j])) * d, dst = (h * b + size_t(slots[j])) * d;
        std::memcpy(k_[i].data() + dst, k_new[i].data() + src, d * sizeof(float));
        std::memcpy(v_[i].data() + dst, v_new[i].data() + src, d * sizeof(float));
      }
  }
}

void IoCaches::fit(const std::string& kind, int used, int need) {
  const int old_b = bucket_.at(kind), new_b = bucket_slots(need, layout_.slots(kind) + spare_, bucket_size_);
  if (old_b == new_b) return;
  const int rows = std::min({used, old_b, new_b});
  for (size_t i = 0; i < layout_.caches.size(); ++i)
    if (layout_.caches[i].kind == kind) {
      relayout(k_[i].data(), layout_.caches[i], old_b, new_b, rows);
      relayout(v_[i].data(), layout_.caches[i], old_b, new_b, rows);
    }
  bucket_[kind] = new_b;
  generation_ += 1;
}

void IoCaches::relayout(float* flat, const CacheSpec& c, int old_b, int new_b, int rows) {
  if (c.num_kv_heads == 1 || rows == 0) return;
  const size_t d = size_t(c.head_dim), n = size_t(rows) * d;
  if (new_b > old_b)
    for (int h = c.num_kv_heads - 1; h > 0; --h)
      std::memmove(flat + h * new_b * d, flat + h * old_b * d, n * sizeof(float));
  else
    for (int h = 1; h < c.num_kv_heads; ++h)
      std::memmove(flat + h * new_b * d, flat + h * old_b * d, n * sizeof(float));
}

}  // namespace es
