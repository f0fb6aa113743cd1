// fixed_eagle3.cpp - see fixed_eagle3.h. Line by line runtimes/fixed_eagle3.py (front_pad_mask, FixedEagle3Drafter).
#include "fixed_eagle3.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "errors.h"

namespace es {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::vector<float> front_pad_mask(int64_t s, int t, int n, int slots, float floor) {
  const int p = n - t, cols = slots + n;
  std::vector<float> mask(size_t(n) * size_t(cols), floor);
  for (int r = 0; r < n; ++r) {
    float* row = mask.data() + size_t(r) * size_t(cols);
    std::fill(row, row + s, 0.0f);  // the written slots
    if (r < p) {
      row[slots + r] = 0.0f;  // a pad row sees itself
    } else {
      std::fill(row + slots + p, row + slots + r + 1, 0.0f);  // real rows: causal over the real new rows
    }
  }
  return mask;
}

FixedEagle3Drafter::FixedEagle3Drafter(FixedEagle3Graphs graphs, const KVLayout& draft, int max_context,
                                       int aux_width, int hidden, int draft_vocab, float mask_floor, AuxRecord** hook)
    : graphs_(std::move(graphs)), draft_(draft), hidden_(hidden), vocab_(draft_vocab), slots_(draft.max_context),
      floor_(mask_floor), record_(max_context, aux_width), rows_(record_, draft.max_context), hook_(hook) {
  if (graphs_.lengths.empty()) throw bundle_error("the eagle3 drafter has no fixed lengths", "re-export the bundle");
  std::sort(graphs_.lengths.begin(), graphs_.lengths.end());
  for (const auto& c : draft_.caches) {
    k_.emplace_back(size_t(c.num_kv_heads) * size_t(slots_) * size_t(c.head_dim), 0.0f);
    v_.emplace_back(k_.back().size(), 0.0f);
  }
  k_new_.resize(draft_.caches.size());
  v_new_.resize(draft_.caches.size());
  token_ids_.resize(size_t(vocab_));
  logits_.resize(size_t(vocab_));
  out_hidden_.resize(size_t(hidden_));
  *hook_ = &record_;
}

FixedEagle3Drafter::~FixedEagle3Drafter() { *hook_ = nullptr; }

int FixedEagle3Drafter::length_for(int t) const {  // callers chunk by the longest length
  return *std::lower_bound(graphs_.lengths.begin(), graphs_.lengths.end(), t);
}

DraftStep FixedEagle3Drafter::step(int64_t token, const std::vector<float>& hidden) {
  const Eagle3Rows::Rows rows = rows_.next(token);
  Eagle3Rows::check_room(rows, slots_);
  Eagle3Rows::drive(  // a first step: the longest length at a time; a chained one: the previous hidden [1, 1, H]
      rows, graphs_.lengths.back(), [&](int64_t from, int n) { fuse(from, n); },
      [&] { x_.assign(hidden.begin(), hidden.end()); }, [&](const int64_t* ids, int n, int64_t s) { run(ids, n, s); });
  rows_.wrote(rows);
  return DraftStep{std::vector<int64_t>(token_ids_.begin(), token_ids_.end()), logits_, out_hidden_};
}

void FixedEagle3Drafter::fuse(int64_t from, int t) {
  const int n = length_for(t);
  const size_t w = size_t(record_.width), h = size_t(hidden_);
  aux_.assign(size_t(n) * w, 0.0f);  // [1, n, W]: the real rows, then zero rows
  std::memcpy(aux_.data(), record_.aux_rows(from), size_t(t) * w * sizeof(float));
  fused_.resize(size_t(n) * h);  // [1, n, H]
  const double start = now_s();
  graphs_.fc(n, aux_.data(), fused_.data());
  kernel_s += now_s() - start;
  x_.assign(fused_.begin(), fused_.begin() + ptrdiff_t(size_t(t) * h));
}

void FixedEagle3Drafter::run(const int64_t* ids, int t, int64_t s) {
  const int n = length_for(t), p = n - t;  // p pad rows at the front (fixed_eagle3.h)
  const size_t h = size_t(hidden_);
  ids_.resize(size_t(n));
  positions_.resize(size_t(n));
  hidden_in_.resize(size_t(n) * h);
  for (int i = 0; i < n; ++i) {
    const int r = std::max(i - p, 0);  // pad rows repeat the first real row
    ids_[size_t(i)] = int32_t(ids[r]);
    positions_[size_t(i)] = int32_t(s + 1 + r);
    std::memcpy(hidden_in_.data() + size_t(i) * h, x_.data() + size_t(r) * h, h * sizeof(float));
  }
  mask_ = front_pad_mask(s, t, n, slots_, floor_);
  for (size_t i = 0; i < draft_.caches.size(); ++i) {
    const CacheSpec& c = draft_.caches[i];
    k_new_[i].resize(size_t(c.num_kv_heads) * size_t(n) * size_t(c.head_dim));
    v_new_[i].resize(k_new_[i].size());
  }
  Eagle3StepCall call;
  call.n = n;
  call.ids = ids_.data();
  call.hidden = hidden_in_.data();
  call.positions = positions_.data();
  call.mask = mask_.data();
  call.k = &k_;
  call.v = &v_;
  call.token_ids = token_ids_.data();
  call.logits = logits_.data();
  call.out_hidden = out_hidden_.data();
  call.k_new = &k_new_;
  call.v_new = &v_new_;
  const double start = now_s();
  graphs_.step(call);
  kernel_s += now_s() - start;
  for (size_t i = 0; i < draft_.caches.size(); ++i) {  // rows p..n - 1 -> slots s..s + t - 1, per head
    const CacheSpec& c = draft_.caches[i];
    const size_t d = size_t(c.head_dim);
    for (size_t j = 0; j < size_t(c.num_kv_heads); ++j) {
      const size_t src = (j * size_t(n) + size_t(p)) * d, dst = (j * size_t(slots_) + size_t(s)) * d;
      std::memcpy(k_[i].data() + dst, k_new_[i].data() + src, size_t(t) * d * sizeof(float));
      std::memcpy(v_[i].data() + dst, v_new_[i].data() + src, size_t(t) * d * sizeof(float));
    }
  }
}

}  // namespace es
