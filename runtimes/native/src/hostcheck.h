// hostcheck.h - the host check of exactness on *this* device's kernels (edge_spec/decoding/hostcheck.py): verify passes vs
// one-token decode steps over the same random tokens, across the backend's bucket edges and each ring's wraps, in
// two row modes (one-row; two-row = every pass carries a masked dummy row). The verdict picks the session's row
// mode; where neither is bit-exact, speculative decoding is turned off (plain decoding, with a notice).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "session.h"

namespace es {

struct HostCheck {
  std::string runtime;  // the backend's identity
  std::string cpu;      // cpu_identity()
  std::vector<std::pair<int, int>> windows;  // (start position, T) of every verify pass compared
  double one_row_max_diff = 0, two_row_max_diff = 0;  // max |verify row - decode step| (0: bit-identical)
  double one_row_step_ms = 0, two_row_step_ms = 0;

  int min_rows() const;  // 1 or 2; 0 when no mode is exact
  bool exact() const { return min_rows() != 0; }
  std::string label() const;    // "exact-one-row" | "exact-two-row" | "inexact"
  std::string summary() const;  // the one line `edge-spec generate` prints
  std::string to_json() const;
  static HostCheck from_json(const std::string& text);  // throws JsonError when damaged
};

// The check for this (artifact, runtime, CPU), cached like the Python runtime's (edge_spec/decoding/hostcheck.py): a file in
// `$EDGE_SPEC_CACHE/hostcheck-native/` (default ~/.cache/edge-spec), keyed by sha256 of the artifact id, the
// runtime identity, the CPU identity and the probe version. `fresh`: probe again. A cache that cannot be read or
// written is ignored (the probe runs). Sets nothing on the session (the caller sets min_rows).
HostCheck checked(Session& session, int vocab_size, const std::string& artifact, int max_t, bool fresh,
                  bool* from_cache = nullptr);

std::string cpu_identity();  // CPU model + the instruction-set features kernels dispatch on
std::vector<std::pair<int, int>> probe_windows(const KVLayout& layout, int max_t, int edge);
// Runs the check on `session` (reset before and after); sets nothing (the caller sets session.min_rows).
HostCheck probe(Session& session, int vocab_size, int max_t = 9, uint64_t seed = 0);

}  // namespace es
