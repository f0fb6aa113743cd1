// test_hooks.h - what only the test build has (edge-spec-run-test: CMakeLists.txt compiles src/cli.cpp with
// ES_TEST_HOOKS and test_hooks.cpp; edge-spec-run, libedge_spec.so and the phone builds have neither): a drafter standing
// in for the bundle's, proposing a known continuation (the plain greedy output) made wrong where told, so accepted bursts,
// rejected ones and rewritten rejected slots are all exercised (tests/test_native*.py: --test-oracle-drafts IDS
// --test-wrong never|always|third|random).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"

namespace es {

// `wrong` selects the positions proposed wrong: "never", "always", "third" (every third position), "random" (40%,
// seeded).
struct OracleDrafts {
  std::vector<int64_t> continuation;
  std::string wrong = "never";
};

// The stand-in for a prompt of `prompt_len` tokens over a vocabulary of `vocab` (GenerateOptions::drafter points at it).
std::unique_ptr<DrafterBackend> make_oracle_drafter(const OracleDrafts& drafts, int prompt_len, int vocab);

}  // namespace es
