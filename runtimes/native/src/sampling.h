// sampling.h - the sampling maths of edge_spec/decoding/sampling.py (float64, same tie rules) and the portable RNG.
//
// token_probs turns raw logits into the distribution actually sampled from (temperature, top-k, top-p); greedy
// (temperature 0) is one-hot on the argmax, lowest id on ties. The speculative verifier applies the same function to
// target and drafter logits.
//
// PortableRng is SplitMix64 (Steele, Lea, Flood 2014) with uniforms (x >> 11) * 2^-53: integer-exact in any language,
// so a seeded run draws the same uniforms here and in edge_spec/decoding/portable_rng.py.
#pragma once

#include <cstdint>
#include <vector>

namespace es {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  int top_k = 0;             // 0: off
  double top_p = 1.0;        // 1: off
  bool greedy() const { return temperature == 0.0; }
};

// Throws Error(Code::Argument) for values with no meaning (as edge_spec.decoding.sampling.check_sampling).
void check_sampling(const SamplingParams& p);

class PortableRng {
 public:
  explicit PortableRng(uint64_t seed = 0) : state_(seed) {}
  uint64_t next_u64();
  double random();  // uniform in [0, 1)

 private:
  uint64_t state_;
};

int64_t argmax(const float* logits, int n);  // lowest index on ties
// logits [V] -> probs [V] (float64), as edge_spec.decoding.sampling.token_probs.
std::vector<double> token_probs(const float* logits, int n, const SamplingParams& p);
// One token by inverse CDF with a single uniform (edge_spec.decoding.sampling.sample).
int64_t sample(const std::vector<double>& probs, PortableRng& rng);
// Greedy: argmax, no draw consumed; else sample(token_probs(...)).
int64_t pick_token(const float* logits, int n, const SamplingParams& p, PortableRng& rng);

}  // namespace es
