// sampling.cpp - see sampling.h; each step follows edge_spec/decoding/sampling.py line by line.
#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "errors.h"

namespace es {

void check_sampling(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    throw config_error("temperature must be a finite number >= 0, got " + std::to_string(p.temperature),
                       "use 0 for greedy decoding or a value such as 0.7");
  if (p.top_k < 0)
    throw config_error("top_k must be an integer >= 0, got " + std::to_string(p.top_k), "use 0 to disable top-k");
  if (!(p.top_p > 0.0 && p.top_p <= 1.0))
    throw config_error("top_p must be in (0, 1], got " + std::to_string(p.top_p), "use 1.0 to disable nucleus sampling");
}

uint64_t PortableRng::next_u64() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double PortableRng::random() { return double(next_u64() >> 11) * (1.0 / 9007199254740992.0); }

int64_t argmax(const float* logits, int n) {
  // Two passes the compiler vectorizes: the maximum over independent lanes, then the first index holding it (lowest
  // id on ties, the same index a single pass of `>` keeps; a NaN never wins either way). One pass that carries the
  // index is a dependency chain: ~0.3 ms per 262,144-entry row at -O3 on the 2-core Xeon here, ~3x the two passes.
  if (n <= 0) return 0;
  constexpr int kLanes = 16;
  float lane[kLanes];
  for (float& l : lane) l = logits[0];
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] = logits[i + j] > lane[j] ? logits[i + j] : lane[j];
  float best = lane[0];
  for (int j = 1; j < kLanes; ++j) best = lane[j] > best ? lane[j] : best;
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (int k = 0; k < n; ++k)
    if (logits[k] == best) return k;
  return 0;  // logits[0] is NaN (a single pass returns 0 then too)
}

std::vector<double> token_probs(const float* logits, int n, const SamplingParams& p) {
  std::vector<double> x(size_t(n), 0.0);
  if (p.greedy()) {
    x[size_t(argmax(logits, n))] = 1.0;
    return x;
  }
  for (int i = 0; i < n; ++i) x[i] = double(logits[i]) / p.temperature;
  if (p.top_k && p.top_k < n) {  // keep values >= the k-th largest (ties at the k-th kept, as numpy's partition)
    std::vector<double> sorted(x);
    std::nth_element(sorted.begin(), sorted.begin() + (n - p.top_k), sorted.end());
    const double kth = sorted[size_t(n - p.top_k)];
    for (auto& v : x)
      if (v < kth) v = -INFINITY;
  }
  const double top = *std::max_element(x.begin(), x.end());
  double total = 0.0;
  for (auto& v : x) {
    v = std::exp(v - top);
    total += v;
  }
  for (auto& v : x) v /= total;
  if (p.top_p < 1.0) {  // nucleus: the smallest most-likely set whose mass reaches top_p (always >= 1 token)
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return -x[a] < -x[b]; });
    std::vector<char> keep(size_t(n), 0);
    double cum = 0.0;  // numpy: mass_before = cumsum(sorted) - sorted (same rounding)
    for (int i : order) {
      cum += x[i];
      if (cum - x[i] < p.top_p) keep[i] = 1;
    }
    double kept = 0.0;
    for (int i = 0; i < n; ++i) {
      if (!keep[i]) x[i] = 0.0;
      kept += x[i];
    }
    for (auto& v : x) v /= kept;
  }
  return x;
}

int64_t sample(const std::vector<double>& probs, PortableRng& rng) {
  std::vector<double> cdf(probs.size());
  std::partial_sum(probs.begin(), probs.end(), cdf.begin());
  const double u = rng.random() * cdf.back();
  const int64_t i = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();  // searchsorted(side="right")
  return std::min<int64_t>(i, int64_t(cdf.size()) - 1);
}

int64_t pick_token(const float* logits, int n, const SamplingParams& p, PortableRng& rng) {
  if (p.greedy()) return argmax(logits, n);
  return sample(token_probs(logits, n, p), rng);
}

}  // namespace es
