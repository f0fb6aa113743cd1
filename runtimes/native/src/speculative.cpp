// speculative.cpp - see speculative.h. Each function follows its namesake in edge_spec/ (same order of rng draws,
// same tie rules), so greedy output is the Python runtime's token for token and seeded sampling draws alike.
#include "speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>

#include "errors.h"

namespace es {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Drafter distributions over their candidates only (0 elsewhere): k rows of (ids sorted ascending, probs).
struct SparseRows {
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::vector<double>> probs;
  double at(size_t i, int64_t x) const {
    auto it = std::lower_bound(ids[i].begin(), ids[i].end(), x);
    return (it != ids[i].end() && *it == x) ? probs[i][size_t(it - ids[i].begin())] : 0.0;
  }
};

// Target distributions [k + 1, V] computed a row at a time, on first use (edge_spec.decoding.speculative.LazyRows).
struct LazyRows {
  const StepOutput& out;
  int vocab;
  const SamplingParams& params;
  std::map<size_t, std::vector<double>> rows;
  const std::vector<double>& row(size_t i) {
    auto it = rows.find(i);
    if (it == rows.end()) it = rows.emplace(i, token_probs(out.logits.data() + i * size_t(vocab), vocab, params)).first;
    return it->second;
  }
};

VerifyResult verify_sampled(const std::vector<int64_t>& drafts, const SparseRows& draft_probs, LazyRows& target,
                            int vocab, PortableRng& rng) {
  for (size_t i = 0; i < drafts.size(); ++i) {
    const int64_t x = drafts[i];
    const double p = target.row(i)[size_t(x)], q = draft_probs.at(i, x);
    const double ratio = q > 0 ? std::min(1.0, p / q) : 1.0;
    if (rng.random() < ratio) continue;
    std::vector<double> residual(target.row(i));  // max(0, p - q), renormalised
    for (size_t j = 0; j < draft_probs.ids[i].size(); ++j) {
      double& r = residual[size_t(draft_probs.ids[i][j])];
      r = r - draft_probs.probs[i][j];
    }
    double total = 0.0;
    for (auto& r : residual) {
      r = std::max(r, 0.0);
      total += r;
    }
    if (total > 0) {
      for (auto& r : residual) r /= total;
      return {int(i), sample(residual, rng)};
    }
    return {int(i), sample(target.row(i), rng)};
  }
  (void)vocab;
  return {int(drafts.size()), sample(target.row(drafts.size()), rng)};
}

int64_t greedy_draft(const DraftStep& step) {  // argmax over the candidates, lowest id on ties
  const float top = *std::max_element(step.logits.begin(), step.logits.end());
  int64_t best = -1;
  for (size_t i = 0; i < step.logits.size(); ++i)
    if (step.logits[i] == top && (best < 0 || step.token_ids[i] < best)) best = step.token_ids[i];
  return best;
}

double confidence(const DraftStep& step, int64_t token) {  // the drafter's temperature-1 probability of `token`
  double top = -INFINITY;
  for (float l : step.logits) top = std::max(top, double(l));
  double sum = 0.0, mine = 0.0;
  for (size_t i = 0; i < step.logits.size(); ++i) {
    const double e = std::exp(double(step.logits[i]) - top);
    sum += e;
    if (step.token_ids[i] == token) mine += e;
  }
  return mine / sum;
}

void sparse_draft_distribution(const DraftStep& step, const SamplingParams& params, std::vector<int64_t>& ids,
                               std::vector<double>& probs) {
  std::vector<size_t> order(step.token_ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return step.token_ids[a] < step.token_ids[b]; });
  std::vector<float> logits(order.size());
  ids.resize(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    ids[i] = step.token_ids[order[i]];
    logits[i] = step.logits[order[i]];
  }
  probs = token_probs(logits.data(), int(logits.size()), params);
}

// The last n tokens of prompt + output (all there are when fewer): what the datastore matches.
std::vector<int64_t> tail(const std::vector<int64_t>& prompt, const std::vector<int64_t>& tokens, int n) {
  const size_t from_tokens = std::min(tokens.size(), size_t(n));
  const size_t from_prompt = std::min(prompt.size(), size_t(n) - from_tokens);
  std::vector<int64_t> out(prompt.end() - from_prompt, prompt.end());
  out.insert(out.end(), tokens.end() - from_tokens, tokens.end());
  return out;
}

std::vector<int64_t> draft(DrafterBackend& drafter, Session& session, int64_t token, std::vector<float> hidden, int k,
                           const SamplingParams& params, PortableRng& rng, const std::set<int64_t>& stop_ids,
                           double min_confidence, bool fast_greedy, SparseRows& probs) {
  std::vector<int64_t> drafts;
  if (k == 0) return drafts;
  drafter.begin(session.length(), session.state.drafter_masks(), session.length());
  for (int i = 0; i < k; ++i) {
    DraftStep step = drafter.step(token, hidden);
    if (fast_greedy) {
      token = greedy_draft(step);
    } else {
      std::vector<int64_t> ids;
      std::vector<double> q;
      sparse_draft_distribution(step, params, ids, q);
      token = ids[size_t(sample(q, rng))];
      probs.ids.push_back(ids);
      probs.probs.push_back(q);
    }
    drafts.push_back(token);
    if (stop_ids.count(token) || (min_confidence > 0 && confidence(step, token) < min_confidence)) break;
    hidden = step.hidden;
  }
  return drafts;
}

std::vector<float> row_of(const std::vector<float>& m, size_t row, int width) {
  return std::vector<float>(m.begin() + row * size_t(width), m.begin() + (row + 1) * size_t(width));
}

}  // namespace

// ---- statistics -------------------------------------------------------------------------------------
double GenerationResult::decode_tok_s() const {
  const double decode = total_s - prefill_s;
  return tokens.size() > 1 && decode > 0 ? double(tokens.size() - 1) / decode : 0.0;
}

std::string GenerationResult::summary() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "prompt %d tok | new %zu tok | first token %.0f ms | decode %.1f tok/s | total %.2f s | "
                "stop: %s", prompt_tokens, tokens.size(), prefill_s * 1000, decode_tok_s(), total_s, stop_reason.c_str());
  return buf;
}

std::string SpecStats::summary() const {
  std::string acc;
  for (int j = 0; j < k_max; ++j) {
    char b[16];
    if (drafted[j]) std::snprintf(b, sizeof b, "%.2f", double(accepted[j]) / double(drafted[j]));
    else std::snprintf(b, sizeof b, "-");
    acc += (j ? " " : "") + std::string(b);
  }
  const double total = std::max(decode_s, 1e-9);
  const double overhead = std::max(decode_s - drafter_s - target_s, 0.0);
  char buf[512];
  std::string lookup = lookup_passes ? " | lookup passes " + std::to_string(lookup_passes) : "";
  if (datastore_passes) lookup += " | datastore passes " + std::to_string(datastore_passes);
  std::snprintf(buf, sizeof buf, "tau %.2f | target calls %d | drafter calls %d%s | accept by pos [%s] | time drafter "
                "%.0f%% target %.0f%% overhead %.0f%%", tau(), target_calls, drafter_calls, lookup.c_str(), acc.c_str(),
                100 * drafter_s / total, 100 * target_s / total, 100 * overhead / total);
  return buf;
}

// ---- checks ----------------------------------------------------------------------------------------
void check_request(const std::vector<int64_t>& prompt, int max_new_tokens, int max_context) {
  if (prompt.empty()) throw config_error("the prompt encodes to zero tokens", "pass a non-empty prompt");
  if (max_new_tokens < 1)
    throw config_error("max_new_tokens must be an integer >= 1, got " + std::to_string(max_new_tokens),
                       "pass --max-new-tokens 1 or more (the number of tokens to generate)");
  if (int64_t(prompt.size()) + max_new_tokens > max_context)
    throw context_error("context overflow: prompt " + std::to_string(prompt.size()) + " + max_new_tokens " +
                            std::to_string(max_new_tokens) + " > max context " + std::to_string(max_context),
                        "shorten the prompt, lower --max-new-tokens, or raise --max-context");
}

void check_spec_args(int k, double min_confidence) {
  if (k < 1) throw config_error("spec_k must be an integer >= 1, got " + std::to_string(k), "use --spec-k 4, for example");
  if (!(min_confidence >= 0.0 && min_confidence < 1.0))
    throw config_error("min_confidence must be in [0, 1), got " + std::to_string(min_confidence),
                       "use --min-confidence 0.3");
}

VerifyResult verify_greedy(const std::vector<int64_t>& drafts, const std::vector<int64_t>& target_argmax) {
  for (size_t i = 0; i < drafts.size(); ++i)
    if (drafts[i] != target_argmax[i]) return {int(i), target_argmax[i]};
  return {int(drafts.size()), target_argmax[drafts.size()]};
}

// ---- the loops ---------------------------------------------------------------------------------------
GenerationResult generate_plain(Session& session, const std::vector<int64_t>& prompt, int max_new_tokens,
                                const SamplingParams& params, PortableRng& rng, const std::set<int64_t>& stop_ids,
                                const TokenSink& on_token) {
  check_request(prompt, max_new_tokens, session.max_context());
  const int vocab = session.backend.vocab_size();
  GenerationResult r;
  r.prompt_tokens = int(prompt.size());
  const double start = now_s();
  session.reset();
  StepOutput out = session.prefill(prompt);
  int64_t token = pick_token(out.logits.data(), vocab, params, rng);
  r.prefill_s = now_s() - start;
  r.tokens.push_back(token);
  bool go = !on_token || on_token(token);
  while (go && !stop_ids.count(token) && int(r.tokens.size()) < max_new_tokens) {
    session.forward_into({token}, true, out);  // `token` is the one not yet in the cache
    session.commit(1);
    r.target_passes += 1;
    token = pick_token(out.logits.data(), vocab, params, rng);
    r.tokens.push_back(token);
    go = !on_token || on_token(token);
  }
  r.stop_reason = !go ? "cancelled" : stop_ids.count(token) ? "eos" : "length";
  r.total_s = now_s() - start;
  return r;
}

GenerationResult generate_speculative(Session& session, DrafterBackend& drafter, const std::vector<int64_t>& prompt,
                                      int max_new_tokens, const SamplingParams& params, PortableRng& rng,
                                      const std::set<int64_t>& stop_ids, int vocab_size, const SpecOptions& options,
                                      const TokenSink& on_token) {
  check_spec_args(options.k, options.min_confidence);
  check_request(prompt, max_new_tokens, session.max_context());
  const int hidden_size = session.backend.hidden_size();
  GenerationResult r;
  r.speculative = true;
  r.prompt_tokens = int(prompt.size());
  SpecStats& stats = r.spec;
  stats.k_max = options.k;
  stats.drafted.assign(size_t(options.k), 0);
  stats.accepted.assign(size_t(options.k), 0);
  std::unique_ptr<CostModel> model(options.adaptive ? new CostModel(options.k) : nullptr);
  const bool fast_greedy = params.greedy();
  const double start = now_s();
  session.reset();
  StepOutput out = session.prefill(prompt);
  int64_t token = pick_token(out.logits.data(), vocab_size, params, rng);  // the one token not yet in the cache
  std::vector<float> hidden = out.hidden;  // [Ht] the target state at the position that predicted `token`
  r.prefill_s = now_s() - start;
  std::vector<int64_t>& tokens = r.tokens;
  tokens.push_back(token);
  std::unique_ptr<PromptLookup> retrieval(options.lookup ? new PromptLookup() : nullptr);
  if (retrieval) {
    std::vector<int64_t> seen(prompt);
    seen.push_back(token);
    retrieval->extend(seen);
  }
  bool go = !on_token || on_token(token);
  while (go && !stop_ids.count(token) && int(tokens.size()) < max_new_tokens) {
    int left = max_new_tokens - int(tokens.size()) - 1;
    if (const int cap = pass_cap(session.state.layout(), session.length(), session.min_rows))  // kv.h pass_cap
      left = std::min(left, cap - 1);
    const double t0 = now_s();
    std::vector<int64_t> drafts;
    SparseRows draft_probs;
    int k_now = 0, source = SOURCE_LOOKUP;
    auto take = [&](const std::vector<int64_t>& proposal) {  // cut after a stop token
      for (int64_t t : proposal) {
        drafts.push_back(t);
        if (stop_ids.count(t)) break;
      }
    };
    if (retrieval) {  // retrieval first, at its own length (CostModel prices the sources apart)
      k_now = std::min(model ? model->choose(SOURCE_LOOKUP) : options.k, left);
      take(retrieval->propose(k_now));
    }
    if (drafts.empty() && options.datastore) {  // then the static datastore, at its own length
      k_now = std::min(model ? model->choose(SOURCE_DATASTORE) : options.k, left);
      source = SOURCE_DATASTORE;
      if (k_now > 0) take(options.datastore->propose(tail(prompt, tokens, options.datastore->max_n()), k_now));
    }
    const bool from_lookup = !drafts.empty();
    if (from_lookup) {  // one-hot drafts: q(draft) = 1, so verify's rule keeps the target's distribution
      for (int64_t d : drafts) {
        draft_probs.ids.push_back({d});
        draft_probs.probs.push_back({1.0});
      }
    } else {
      k_now = std::min(model ? model->choose() : options.k, left);
      drafts = draft(drafter, session, token, hidden, k_now, params, rng, stop_ids,
                     options.adaptive ? options.min_confidence : 0.0, fast_greedy, draft_probs);
    }
    stats.k_chosen.push_back(k_now);
    const double t1 = now_s();
    std::vector<int64_t> pass = {token};
    pass.insert(pass.end(), drafts.begin(), drafts.end());
    session.forward_into(pass, false, out);  // [1 + len(drafts)] rows
    const double t2 = now_s();
    VerifyResult v;
    if (options.accept_all) {  // the test hook (SpecOptions::accept_all): every draft kept
      const size_t k = drafts.size();
      if (fast_greedy) {
        v = {int(k), argmax(out.logits.data() + k * size_t(vocab_size), vocab_size)};
      } else {
        LazyRows rows{out, vocab_size, params, {}};
        v = {int(k), sample(rows.row(k), rng)};
      }
    } else if (fast_greedy) {
      std::vector<int64_t> top(size_t(out.rows));
      for (int i = 0; i < out.rows; ++i) top[i] = argmax(out.logits.data() + size_t(i) * vocab_size, vocab_size);
      v = verify_greedy(drafts, top);
    } else {
      LazyRows rows{out, vocab_size, params, {}};
      v = verify_sampled(drafts, draft_probs, rows, vocab_size, rng);
    }
    const int n = v.accepted;
    session.commit(n + 1);
    hidden = row_of(out.hidden, size_t(n), hidden_size);
    stats.drafter_s += t1 - t0;
    stats.target_s += t2 - t1;
    stats.target_calls += 1;
    for (size_t j = 0; j < drafts.size(); ++j) stats.drafted[j] += 1;
    for (int j = 0; j < n; ++j) stats.accepted[j] += 1;
    stats.emitted_by_passes += n + 1;
    if (from_lookup && source == SOURCE_DATASTORE) {
      stats.datastore_passes += 1;
      stats.datastore_accepted += n;
    } else if (from_lookup) {
      stats.lookup_passes += 1;
      stats.lookup_accepted += n;
    } else {
      stats.drafter_calls += int(drafts.size());
    }
    if (model) {
      model->observe_verify(1 + int(drafts.size()), t2 - t1);
      if (!drafts.empty() && !from_lookup) model->observe_draft((t1 - t0) / double(drafts.size()));
      if (!drafts.empty()) model->observe_acceptance(int(drafts.size()), n, from_lookup ? source : SOURCE_MTP);
    }
    const size_t emitted = tokens.size();
    std::vector<int64_t> accepted(drafts.begin(), drafts.begin() + n);
    accepted.push_back(v.next_token);
    for (int64_t t : accepted) {
      tokens.push_back(t);
      go = !on_token || on_token(t);
      if (!go || stop_ids.count(t) || int(tokens.size()) >= max_new_tokens) break;
    }
    if (retrieval) retrieval->extend(std::vector<int64_t>(tokens.begin() + emitted, tokens.end()));
    token = tokens.back();
  }
  const double end = now_s();
  r.target_passes = stats.target_calls;
  stats.decode_s = end - start - r.prefill_s;
  r.stop_reason = !go ? "cancelled" : stop_ids.count(tokens.back()) ? "eos" : "length";
  r.total_s = end - start;
  return r;
}

}  // namespace es
