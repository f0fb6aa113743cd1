// backend.h - the one small protocol every format's runtime implements (edge_spec/contract/backend.py): a Backend runs the
// target over T new tokens at runtime-built positions and masks; a DrafterBackend runs one draft step reading the
// target backend's caches. The Session (session.h) owns all bookkeeping; backends hold buffers and nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv.h"

namespace es {

struct StepOutput {
  int rows = 0;
  std::vector<float> logits;  // [rows, V] (rows = 1 when the caller asked for the last position only)
  std::vector<float> hidden;  // [rows, H] final hidden states (after the final norm)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const KVLayout& layout() const = 0;
  virtual int vocab_size() const = 0;
  virtual int hidden_size() const = 0;
  // What kernels run (library, version, threads): part of the host check's identity.
  virtual std::string identity() const = 0;
  // The host check probes passes across the edges of the slots attended (multiples of this); 0: none.
  virtual int bucket_size() const { return 0; }
  // A first token the host check's probe starts with (a backend whose position 0 holds only some: a QNN bundle's
  // precomputed table), or -1: any.
  virtual int64_t first_token() const { return -1; }
  // ids, positions: [T]; masks: kind -> [T, S_kind + T]. n_cached: committed positions (slots >= it are empty).
  virtual StepOutput forward(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
                             const Masks& masks, int64_t n_cached, bool last_only) = 0;
  // forward() into `out`, reusing its buffers: a backend that can write its outputs there directly overrides it, so
  // a decode loop holding one StepOutput neither allocates nor copies [T, V] logits per pass (5 MB at T = 5 for a
  // 262k vocabulary). The default is forward() assigned.
  virtual void forward_into(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
                            const Masks& masks, int64_t n_cached, bool last_only, StepOutput& out) {
    out = forward(ids, positions, masks, n_cached, last_only);
  }
  // Accept the first rows of the last forward (`io` binding writes them; `state`: nothing to copy).
  virtual void commit(const CommitPlan& plan) = 0;
  virtual void reset() = 0;
  double kernel_s = 0.0;  // seconds inside the runtime's compute call
};

struct DraftStep {
  std::vector<int64_t> token_ids;  // [N] candidate ids
  std::vector<float> logits;       // [N]
  std::vector<float> hidden;       // [Ht] the next draft step's hidden input
};

class DrafterBackend {
 public:
  virtual ~DrafterBackend() = default;
  // Start a burst at the bonus token's `position`; masks: kind -> [1, S_kind].
  virtual void begin(int64_t position, const Masks& masks, int64_t n_cached) = 0;
  virtual DraftStep step(int64_t token, const std::vector<float>& hidden) = 0;
  double kernel_s = 0.0;
};

}  // namespace es
