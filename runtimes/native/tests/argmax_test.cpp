// argmax_test.cpp - es::argmax (sampling.cpp: two vectorizable passes) against its definition, the lowest index
// holding the maximum as one pass of `>` finds it, on random rows of every length 1..70 and 262,144, with ties,
// signed zeros, infinities and NaNs.
//
//   argmax_test      exit 0 and "argmax: N rows, all equal" when every row agrees
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "sampling.h"

namespace {

int64_t definition(const float* x, int n) {  // the single pass the greedy rule is defined by
  int64_t best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> small(-2, 2);  // few distinct values: many ties
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  int rows = 0, failures = 0;
  std::vector<int> lengths;
  for (int n = 1; n <= 70; ++n) lengths.push_back(n);
  lengths.push_back(262144);
  for (int n : lengths) {
    for (int variant = 0; variant < 6; ++variant) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = variant % 2 ? float(small(rng)) : normal(rng);
      if (variant >= 2)  // sprinkle special values, at the front too (variant 4, 5: x[0] is one)
        for (int s = 0; s < 1 + n / 8; ++s) x[size_t(rng() % unsigned(n))] = specials[rng() % 5];
      if (variant >= 4) x[0] = specials[rng() % 5];
      ++rows;
      const int64_t want = definition(x.data(), n), got = es::argmax(x.data(), n);
      if (want != got && ++failures <= 10)
        std::fprintf(stderr, "FAIL n=%d variant=%d: argmax %lld, definition %lld\n", n, variant, (long long)got,
                     (long long)want);
    }
  }
  if (failures) return 1;
  std::printf("argmax: %d rows, all equal\n", rows);
  return 0;
}
