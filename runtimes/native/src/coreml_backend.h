// coreml_backend.h - the Backend and DrafterBackend over a coreml bundle's one multifunction .mlpackage (Apple's
// Core ML; a port of runtimes/coreml.py on top of runtimes/fixed.py's FixedBackend / FixedDrafter, whose format-neutral
// half is fixed.h). The package holds the target at fixed pass lengths (`target_{T}`) and the drafter step
// (`drafter`); the backend compiles it once (the .mlmodelc is cached under the caches folder), loads one MLModel per
// function (MLModelConfiguration.functionName: macOS 15 / iOS 18) on the compute units asked for, and pads each pass
// to the next exported length. `io` binding: the runner holds the caches ([1, H_kv, S_f, D] float32 per cached
// layer), hands them to every call without a copy and writes the accepted rows at commit; `state` binding: one
// MLState (newState of the first function) is passed to every prediction, the target's and the drafter's.
//
// Written in Objective-C++ (coreml_model.mm, coreml_backend.mm), compiled only on Apple platforms: CMakeLists.txt
// defines ES_HAVE_COREML there (with -fobjc-arc, CoreML + Foundation), elsewhere engine.cpp refuses coreml bundles.
// This header is plain C++ (the engine and the CLI include it everywhere).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"
#include "errors.h"
#include "manifest.h"

namespace es {

// runtimes/coreml.py COMPUTE_UNITS (the Python `--compute-units`): MLComputeUnits All, CPUAndNeuralEngine,
// CPUAndGPU, CPUOnly. "" means the default, all.
inline const std::vector<std::string>& coreml_compute_units() {
  static const std::vector<std::string> units = {"all", "cpu_and_ne", "cpu_and_gpu", "cpu"};
  return units;
}

inline void check_compute_units(const std::string& units) {
  std::string names;
  for (const auto& u : coreml_compute_units()) {
    if (units == u) return;
    names += (names.empty() ? "" : ", ") + u;
  }
  throw config_error("unknown compute units '" + units + "'", "choose one of " + names);
}

// Opens <folder>/<target file> (the .mlpackage) for the manifest `m` (read and verified) on `compute_units` ("" =
// all). Throws Error(Code::Bundle / Backend / Argument) naming the package or function and the fix; on an OS older
// than macOS 15 / iOS 18 it refuses with the versions needed. Defined in coreml_backend.mm (ES_HAVE_COREML only).
std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_coreml(const std::string& folder,
                                                                                 const Manifest& m,
                                                                                 const std::string& compute_units);

}  // namespace es
