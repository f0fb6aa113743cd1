// session.cpp - see session.h.
#include "session.h"

#include <algorithm>

#include "errors.h"

namespace es {

Session::Session(Backend& b, int chunk, int rows)
    : backend(b), state(b.layout()), prefill_chunk(chunk), min_rows(rows) {}

StepOutput Session::forward(const std::vector<int64_t>& tokens, bool last_only) {
  StepOutput out;
  forward_into(tokens, last_only, out);
  return out;
}

void Session::forward_into(const std::vector<int64_t>& tokens, bool last_only, StepOutput& out) {
  const int n = int(tokens.size());
  const int pad = (n > 0 && n < min_rows && state.length + min_rows <= max_context()) ? min_rows - n : 0;
  const int rows = n + pad;
  Masks masks = state.masks(rows);
  std::vector<int64_t> ids(tokens);
  for (int i = 0; i < pad; ++i) ids.push_back(tokens.back());  // dummy rows: the last token again
  std::vector<int64_t> positions(static_cast<size_t>(rows));
  for (int i = 0; i < rows; ++i) positions[i] = state.length + i;
  if (!pad) {
    backend.forward_into(ids, positions, masks, state.length, last_only, out);
    if (writes_all(state.layout().binding)) state.written(rows);  // the program wrote every row
    return;
  }
  const StepOutput all = backend.forward(ids, positions, masks, state.length, false);
  if (writes_all(state.layout().binding)) state.written(rows);  // the program wrote every row (dummies too)
  const int v = backend.vocab_size(), h = backend.hidden_size();  // drop the dummy rows
  const int first = last_only ? n - 1 : 0;
  out.rows = n - first;
  out.logits.assign(all.logits.begin() + size_t(first) * v, all.logits.begin() + size_t(n) * v);
  out.hidden.assign(all.hidden.begin() + size_t(first) * h, all.hidden.begin() + size_t(n) * h);
}

void Session::commit(int n) {
  CommitPlan plan = state.plan_commit(n);
  backend.commit(plan);
  state.advance(n, plan);
}

StepOutput Session::prefill(const std::vector<int64_t>& tokens) {
  if (tokens.empty()) throw config_error("the prompt encodes to zero tokens", "pass a non-empty prompt");
  state.check_fits(int(tokens.size()));
  const int max_pass = state.layout().max_pass;
  const int size = max_pass > 0 ? std::min(prefill_chunk, max_pass) : prefill_chunk;
  StepOutput out;
  for (size_t start = 0; start < tokens.size(); start += size_t(size)) {
    std::vector<int64_t> chunk(tokens.begin() + start, tokens.begin() + std::min(tokens.size(), start + size));
    out = forward(chunk, true);
    commit(int(chunk.size()));
  }
  return out;
}

void Session::rewind(int64_t pos) {
  state.rewind(pos);
  backend.reset();
}

void Session::reset() {
  state.reset();
  backend.reset();
}

}  // namespace es
