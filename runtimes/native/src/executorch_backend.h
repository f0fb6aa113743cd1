// executorch_backend.h - the Backend and DrafterBackend over one .pte's `target` and `drafter` methods (XNNPACK,
// CPU), sharing the program's KV buffers (the contract's `state` binding; exporters/executorch.py). Mirrors
// runtimes/executorch.py: the program writes every row of a forward into its caches, so commit only accepts (KVState
// masks the rest); each forward attends over the first S_kind slots, S_kind = the smallest multiple of BUCKET holding
// every visible key and the slots it writes.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "backend.h"
#include "manifest.h"

namespace es {

constexpr int ET_BUCKET = 64;

// Opens the bundle's program (mmap, memory arenas shared by its methods) and loads both methods.
// threads: XNNPACK's pool size (0: leave the default). Throws Error(Code::Bundle / Code::Backend) naming the file.
std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_executorch(const std::string& folder,
                                                                                     const Manifest& manifest,
                                                                                     int threads);

}  // namespace es
