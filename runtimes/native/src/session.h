// session.h - KV state + a backend: prefill, forward, commit, rewind (edge_spec/contract/backend.py Session).
//
// min_rows = 2 makes a one-token pass carry a second, masked dummy row (the last token again at the next position),
// never committed, so every target pass takes the multi-row kernels (the host check sets it; hostcheck.h).
#pragma once

#include <cstdint>
#include <vector>

#include "backend.h"
#include "kv.h"

namespace es {

class Session {
 public:
  Session(Backend& backend, int prefill_chunk = 128, int min_rows = 1);

  int64_t length() const { return state.length; }
  int max_context() const { return state.layout().max_context; }

  // T tokens at positions [length, length + T), not committed. Returns [T, V] (or [1, V] when last_only).
  StepOutput forward(const std::vector<int64_t>& tokens, bool last_only = false);
  // forward() into `out`, reusing its buffers (Backend::forward_into): the decode loops' per-pass call.
  void forward_into(const std::vector<int64_t>& tokens, bool last_only, StepOutput& out);
  void commit(int n);  // keep the first n rows of the last forward
  // Commits every token in chunks of min(prefill_chunk, max_pass); the last position's output [1, V].
  StepOutput prefill(const std::vector<int64_t>& tokens);
  void rewind(int64_t pos);
  void reset();

  Backend& backend;
  KVState state;
  int prefill_chunk;
  int min_rows;
};

}  // namespace es
