// speculative.h - plain decoding and the lossless draft-verify loop (edge_spec/decoding/generate.py, edge_spec/decoding/speculative.py,
// edge_spec/decoding/lookup.py), format-neutral: a Session over any Backend, any DrafterBackend.
//
// One loop: propose k drafts (prompt lookup first, else the MTP drafter) -> one target pass over [last, *drafts]
// -> verify -> commit n + 1. Greedy verify keeps drafts while they are the target's argmax; sampled verify is
// Leviathan et al.'s rule (accept with min(1, p/q), residual max(0, p - q) on rejection, bonus from p[k]).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend.h"
#include "datastore.h"
#include "sampling.h"
#include "session.h"

namespace es {

// Called with each emitted token, in order; return false to stop generating (the C API's cancel).
using TokenSink = std::function<bool(int64_t)>;

struct SpecStats {
  int k_max = 0;
  int target_calls = 0;  // verify passes after the prefill
  int drafter_calls = 0;
  std::vector<int64_t> drafted, accepted;  // [k_max] per draft position
  int emitted_by_passes = 0;
  double drafter_s = 0, target_s = 0, decode_s = 0;
  std::vector<int> k_chosen;
  int lookup_passes = 0, lookup_accepted = 0;
  int datastore_passes = 0, datastore_accepted = 0;  // passes drafted by the static datastore (datastore.h)
  double tau() const { return target_calls ? double(emitted_by_passes) / target_calls : 0.0; }
  std::string summary() const;  // the line `edge-spec generate` prints
};

struct GenerationResult {
  std::vector<int64_t> tokens;  // new tokens only (the stop token included, if one was produced)
  int prompt_tokens = 0;
  std::string stop_reason;  // "eos" | "length" | "cancelled"
  double prefill_s = 0, total_s = 0;
  int target_passes = 0;  // plain steps + verify passes (the prefill not counted)
  bool speculative = false;
  SpecStats spec;
  double decode_tok_s() const;
  std::string summary() const;  // as edge_spec.decoding.generate.GenerationResult.summary
};

// Refuse before any work (edge_spec.decoding.generate.check_request).
void check_request(const std::vector<int64_t>& prompt, int max_new_tokens, int max_context);

GenerationResult generate_plain(Session& session, const std::vector<int64_t>& prompt, int max_new_tokens,
                                const SamplingParams& params, PortableRng& rng, const std::set<int64_t>& stop_ids,
                                const TokenSink& on_token = nullptr);

struct SpecOptions {
  int k = 4;
  bool adaptive = false;
  double min_confidence = 0.0;  // used only when adaptive (as the Python loop)
  bool lookup = true;           // prompt-lookup drafting first
  const Datastore* datastore = nullptr;  // then the static datastore (null: none); the caller owns it
  // A *wrong* verifier that keeps every draft (edge_spec.decoding.speculative.accept_all; the bonus token from the row
  // after the drafts): the test build's --test-accept-all only, so that a drafter's accepted rows are exercised.
  bool accept_all = false;
};

GenerationResult generate_speculative(Session& session, DrafterBackend& drafter, const std::vector<int64_t>& prompt,
                                      int max_new_tokens, const SamplingParams& params, PortableRng& rng,
                                      const std::set<int64_t>& stop_ids, int vocab_size, const SpecOptions& options,
                                      const TokenSink& on_token = nullptr);

void check_spec_args(int k, double min_confidence);

// ---- pieces, exposed for tests ----------------------------------------------------------------------
struct VerifyResult {
  int accepted;        // n: drafts kept (a prefix)
  int64_t next_token;  // correction (on rejection) or bonus (all accepted)
};
VerifyResult verify_greedy(const std::vector<int64_t>& drafts, const std::vector<int64_t>& target_argmax);

// Retrieval drafting (edge_spec.decoding.lookup.PromptLookup): n-grams (n in [min_n, max_n]) -> their latest start.
class PromptLookup {
 public:
  PromptLookup(int min_n = 2, int max_n = 4);
  void extend(const std::vector<int64_t>& tokens);
  std::vector<int64_t> propose(int k) const;

 private:
  int min_n_, max_n_;
  std::vector<int64_t> tokens_;
  std::map<std::vector<int64_t>, int64_t> latest_;
  std::map<int, int64_t> earlier_;  // n -> start of the suffix n-gram's latest earlier occurrence (-1: none)
};

// The adaptive draft length's cost model (edge_spec.decoding.cost_model.CostModel): the MTP drafter, retrieval and
// the static datastore (`source`) are priced apart, and a source below k_max drafts one position more every
// probe_every passes.
enum DraftSource { SOURCE_MTP = 0, SOURCE_LOOKUP = 1, SOURCE_DATASTORE = 2 };  // false / true: the first two
class CostModel {
 public:
  explicit CostModel(int k_max);
  void observe_verify(int tokens, double seconds);
  void observe_draft(double seconds_per_step);
  void observe_acceptance(int drafted, int accepted, int source = SOURCE_MTP);
  double expected_tokens(int k, int source = SOURCE_MTP) const;
  double verify_cost(int tokens) const;
  int choose(int source = SOURCE_MTP);

 private:
  double ema(double old, bool has_old, double value) const;
  int k_max_;
  double decay_ = 0.25;
  int probe_every_ = 16;
  std::map<int, double> verify_s_;
  double draft_s_ = 0.0;
  bool has_draft_ = false;
  std::vector<double> accept_[3];  // [source][k_max] acceptance at each position, given it is reached
  int since_probe_[3] = {0, 0, 0};  // passes since a probe, per source
};

}  // namespace es
