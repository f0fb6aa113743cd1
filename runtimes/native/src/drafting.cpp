// drafting.cpp - see speculative.h: what the loops (speculative.cpp) ask before each target pass: retrieval drafting
// (PromptLookup, as edge_spec.decoding.lookup) and the adaptive draft length (CostModel, as
// edge_spec.decoding.speculative's cost model).
#include "speculative.h"

#include <algorithm>
#include <cmath>

#include "errors.h"

namespace es {

// ---- retrieval drafting ------------------------------------------------------------------------------
PromptLookup::PromptLookup(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {
  if (!(1 <= min_n && min_n <= max_n)) throw config_error("need 1 <= min_n <= max_n for prompt lookup");
}

void PromptLookup::extend(const std::vector<int64_t>& tokens) {
  for (int64_t token : tokens) {
    tokens_.push_back(token);
    const int64_t end = int64_t(tokens_.size());
    for (int n = min_n_; n <= max_n_; ++n) {
      if (end < n) {
        earlier_[n] = -1;
        continue;
      }
      std::vector<int64_t> gram(tokens_.end() - n, tokens_.end());
      auto it = latest_.find(gram);
      earlier_[n] = it == latest_.end() ? -1 : it->second;
      latest_[gram] = end - n;
    }
  }
}

std::vector<int64_t> PromptLookup::propose(int k) const {
  if (k < 1) return {};
  for (int n = max_n_; n >= min_n_; --n) {
    auto it = earlier_.find(n);
    if (it != earlier_.end() && it->second >= 0) {
      const size_t from = size_t(it->second + n), to = std::min(tokens_.size(), from + size_t(k));
      return std::vector<int64_t>(tokens_.begin() + from, tokens_.begin() + to);
    }
  }
  return {};
}

// ---- adaptive draft length ---------------------------------------------------------------------------
CostModel::CostModel(int k_max) : k_max_(k_max) {
  for (auto& rates : accept_) rates.assign(size_t(k_max), 0.6);  // prior until measured
}

double CostModel::ema(double old, bool has_old, double value) const {
  return has_old ? (1 - decay_) * old + decay_ * value : value;
}

void CostModel::observe_verify(int tokens, double seconds) {
  auto it = verify_s_.find(tokens);
  verify_s_[tokens] = ema(it == verify_s_.end() ? 0.0 : it->second, it != verify_s_.end(), seconds);
}

void CostModel::observe_draft(double seconds_per_step) {
  draft_s_ = ema(draft_s_, has_draft_, seconds_per_step);
  has_draft_ = true;
}

void CostModel::observe_acceptance(int drafted, int accepted, int source) {
  std::vector<double>& rates = accept_[source];
  for (int i = 0; i < std::min(drafted, accepted + 1); ++i) rates[i] = ema(rates[i], true, i < accepted ? 1.0 : 0.0);
}

double CostModel::expected_tokens(int k, int source) const {
  const std::vector<double>& rates = accept_[source];
  double total = 1.0, prod = 1.0;
  for (int i = 0; i < k; ++i) {
    prod *= rates[i];
    total += prod;
  }
  return total;
}

double CostModel::verify_cost(int tokens) const {
  if (verify_s_.count(tokens)) return verify_s_.at(tokens);
  std::vector<int> known;  // measured pass lengths, ascending
  for (const auto& e : verify_s_) known.push_back(e.first);
  if (known.size() == 1) return verify_s_.at(known[0]);
  int lo = known.front(), hi = known.back();  // the nearest measured lengths below and above, where they exist
  for (int t : known)
    if (t < tokens) lo = t;
  for (auto it = known.rbegin(); it != known.rend(); ++it)
    if (*it > tokens) hi = *it;
  if (lo == hi) {  // outside the measured range: extend the nearest segment's slope
    if (tokens > known.back()) lo = known[known.size() - 2], hi = known.back();
    else lo = known[0], hi = known[1];
  }
  const double slope = (verify_s_.at(hi) - verify_s_.at(lo)) / double(hi - lo);
  return std::max(verify_s_.at(lo) + slope * (tokens - lo), 1e-9);
}

int CostModel::choose(int source) {
  const bool lookup = source != SOURCE_MTP;  // retrieval's drafts (either kind) cost nothing to make
  if (!verify_s_.count(1)) return 0;  // exploration first: a plain step, then a full burst
  if (verify_s_.size() < 2 || (!lookup && !has_draft_)) return k_max_;
  int best = 0;
  double best_rate = -INFINITY;
  for (int k = 0; k <= k_max_; ++k) {
    const double draft = lookup ? 0.0 : k * draft_s_;  // retrieval's drafts cost nothing to make
    const double rate = expected_tokens(k, source) / (verify_cost(k + 1) + draft);
    if (rate > best_rate) best_rate = rate, best = k;
  }
  int& since = since_probe_[source];
  if (best == k_max_) {
    since = 0;
    return best;
  }
  if (++since > probe_every_) {  // re-measure the position past the chosen ones
    since = 0;
    return std::min(best ? best + 1 : 2, k_max_);
  }
  return best;
}

}  // namespace es
