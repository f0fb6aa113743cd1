// coreml_model.h - Objective-C++ (included by the .mm files only): one function of a compiled multifunction Core ML
// package as an MLModel, its features checked against the manifest, fed from the runner's buffers and read back into
// them through tensor.h (strides and fp16 handled there, in plain C++). See coreml_backend.h for the whole.
#pragma once

#ifdef ES_HAVE_COREML

#import <CoreML/CoreML.h>
#import <Foundation/Foundation.h>

#include <map>
#include <string>
#include <vector>

#include "manifest.h"
#include "tensor.h"

namespace es {
namespace coreml {

extern const char* const FIX;  // how to re-export a coreml bundle

// A runner buffer handed to an input: contract name -> contiguous data of `type` and `dims`.
struct Feed {
  const void* data = nullptr;
  DType type = DType::F32;
  std::vector<int64_t> dims;
};
using Feeds = std::map<std::string, Feed>;

// One input or output: the contract's name (mask.full), the feature's (mask_full), the fixed dims the manifest gives
// it at this function's length, and the element type the function declares (read from its model description).
struct Feature {
  std::string contract, feature;
  std::vector<int64_t> dims;
  DType type = DType::F32;
};
Feature feature(const std::string& contract, std::vector<int64_t> dims);

struct API_AVAILABLE(macos(15.0), ios(18.0)) Function {
  MLModel* model = nil;
  std::string name, where;  // where: "<package> (function <name>)", for every message
  std::vector<Feature> inputs, outputs;

  // One prediction over `feeds` (every input by contract name; `state`: the shared MLState, or nil). Converted
  // inputs live in MLMultiArrays Core ML owns; inputs of the declared type wrap the runner's buffer (no copy).
  id<MLFeatureProvider> run(const Feeds& feeds, MLState* state, double* kernel_s) const;
  // Copies the box of output `contract` into dst (float32, or int64 for token ids), any strides / fp16.
  void read(id<MLFeatureProvider> out, const std::string& contract, const Box& box, float* dst) const;
  void read(id<MLFeatureProvider> out, const std::string& contract, const Box& box, int64_t* dst) const;
};

// The package compiled for this device (MLModel compileModelAtURL), cached under $EDGE_SPEC_CACHE/coreml or the
// user's caches folder, keyed by the package files' sha256 (from the manifest) and the OS version. `fresh`: compile
// again (a cached copy Core ML could not load). Throws Error(Bundle) with Core ML's reason.
NSURL* compiled_package(const std::string& package, const std::string& key, bool fresh);
// The cache key of the package at `rel` inside the bundle: every file under it with its manifest sha256.
std::string package_key(const Manifest& m, const std::string& rel);

MLComputeUnits compute_units(const std::string& units);  // "" | all | cpu_and_ne | cpu_and_gpu | cpu
std::string os_version();

// Loads function `name` of the compiled package and checks its description: exactly the `inputs` / `outputs`
// (feature names, multi-array dims; state features aside), recording each one's declared element type.
API_AVAILABLE(macos(15.0), ios(18.0))
Function load_function(NSURL* compiled, const std::string& package, const std::string& name, MLComputeUnits units,
                       std::vector<Feature> inputs, std::vector<Feature> outputs);
// `state` binding: the function declares exactly these states (feature name -> buffer shape).
API_AVAILABLE(macos(15.0), ios(18.0))
void check_states(const Function& f, const std::map<std::string, std::vector<int64_t>>& states);

}  // namespace coreml
}  // namespace es

#endif  // ES_HAVE_COREML
