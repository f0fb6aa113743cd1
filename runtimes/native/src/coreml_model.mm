// coreml_model.mm - see coreml_model.h. Objective-C++ with ARC; compiled only with ES_HAVE_COREML (Apple platforms,
// CMakeLists.txt). Every NSError becomes an es::Error naming the package or function, Core ML's reason and the fix.
#ifdef ES_HAVE_COREML

#if !__has_feature(objc_arc)
#error "coreml_model.mm needs ARC: compile it with -fobjc-arc (CMakeLists.txt does)"
#endif

#include "coreml_model.h"

#include <chrono>
#include <cstdlib>
#include <exception>

#include <unistd.h>

#include "errors.h"
#include "fixed.h"
#include "sha256.h"

namespace es {
namespace coreml {

const char* const FIX = "re-export the bundle: edge-spec export --format coreml --out DIR";

namespace {

NSString* ns(const std::string& s) { return [NSString stringWithUTF8String:s.c_str()]; }
std::string text(NSString* s) { return s ? std::string(s.UTF8String) : std::string(); }

// Core ML's reason, one line: "<description> (<domain> <code>)".
std::string why(NSError* err) {
  if (!err) return "no reason given";
  std::string line = text(err.localizedDescription);
  line = line.substr(0, line.find('\n'));
  if (line.size() > 300) line = line.substr(0, 300);
  return line + " (" + text(err.domain) + " " + std::to_string(long(err.code)) + ")";
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool dtype_of(MLMultiArrayDataType t, DType* out) {
  switch (t) {
    case MLMultiArrayDataTypeFloat32: *out = DType::F32; return true;
    case MLMultiArrayDataTypeFloat16: *out = DType::F16; return true;
    case MLMultiArrayDataTypeDouble: *out = DType::F64; return true;
    case MLMultiArrayDataTypeInt32: *out = DType::I32; return true;
    default: return false;  // a type the runner does not read (int8 on newer SDKs)
  }
}

MLMultiArrayDataType ml_type(DType t) {
  switch (t) {
    case DType::F16: return MLMultiArrayDataTypeFloat16;
    case DType::F64: return MLMultiArrayDataTypeDouble;
    case DType::I32: return MLMultiArrayDataTypeInt32;
    default: return MLMultiArrayDataTypeFloat32;
  }
}

std::vector<int64_t> dims_of(NSArray<NSNumber*>* shape) {
  std::vector<int64_t> out;
  for (NSNumber* d in shape) out.push_back(d.longLongValue);
  return out;
}

NSArray<NSNumber*>* ns_dims(const std::vector<int64_t>& dims) {
  NSMutableArray<NSNumber*>* out = [NSMutableArray arrayWithCapacity:dims.size()];
  for (int64_t d : dims) [out addObject:@(d)];
  return out;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

NSURL* cache_root() {
  const char* env = std::getenv("EDGE_SPEC_CACHE");
  if (env && *env) return [NSURL fileURLWithPath:[ns(env) stringByAppendingPathComponent:@"coreml"] isDirectory:YES];
  NSURL* caches = [NSFileManager.defaultManager URLForDirectory:NSCachesDirectory inDomain:NSUserDomainMask
                                              appropriateForURL:nil create:YES error:nil];
  return caches ? [caches URLByAppendingPathComponent:@"edge-spec/coreml" isDirectory:YES] : nil;
}

// An input Core ML owns, filled from the runner's buffer converted to the declared type (contiguous strides).
MLMultiArray* converted(const Feed& feed, const Feature& f, const std::string& where) {
  NSError* err = nil;
  MLMultiArray* a = [[MLMultiArray alloc] initWithShape:ns_dims(f.dims) dataType:ml_type(f.type) error:&err];
  if (!a)
    throw backend_error(where + ": cannot allocate input " + f.feature + " (" + why(err) + ")", "check free memory");
  size_t n = 1;
  for (int64_t d : f.dims) n *= size_t(d);
  __block std::string error;
  [a getMutableBytesWithHandler:^(void* bytes, NSInteger size, NSArray<NSNumber*>* strides) {
    if (dims_of(strides) != contiguous_strides(f.dims) || size_t(size) < n * dtype_size(f.type)) {
      error = "Core ML allocated input " + f.feature + " with strides " + dims_text(dims_of(strides));
      return;
    }
    try {  // no C++ exception may unwind through Core ML's frames
      if (feed.type == DType::I32) convert(static_cast<const int32_t*>(feed.data), n, f.type, bytes);
      else convert(static_cast<const float*>(feed.data), n, f.type, bytes);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }];
  if (!error.empty()) throw backend_error(where + ": input " + f.feature + ": " + error, FIX);
  return a;
}

MLMultiArray* input_array(const Feed& feed, const Feature& f, const std::string& where) {
  if (feed.dims != f.dims)
    throw kv_state_error(where + ": input " + f.feature + " is fed " + dims_text(feed.dims) + ", the function takes " +
                             dims_text(f.dims),
                         "report this (the runner pads every pass to an exported length)");
  if (feed.type != f.type) return converted(feed, f, where);
  NSError* err = nil;  // the declared type: wrap the runner's buffer, no copy (it outlives the prediction)
  MLMultiArray* a = [[MLMultiArray alloc] initWithDataPointer:const_cast<void*>(feed.data)
                                                        shape:ns_dims(f.dims)
                                                     dataType:ml_type(f.type)
                                                      strides:ns_dims(contiguous_strides(f.dims))
                                                  deallocator:nil
                                                        error:&err];
  if (!a) throw backend_error(where + ": cannot wrap input " + f.feature + " (" + why(err) + ")", FIX);
  return a;
}

// Checks `got` (a model description's features) against `want`, recording each one's declared type.
API_AVAILABLE(macos(15.0), ios(18.0))
void match(const std::string& where, NSDictionary<NSString*, MLFeatureDescription*>* got, std::vector<Feature>& want,
           const char* role) {
  std::string have, expected;
  size_t count = 0;
  for (NSString* name in got)
    if (got[name].type != MLFeatureTypeState) {  // states travel in the MLState, not as inputs
      have += (have.empty() ? "" : ", ") + text(name);
      ++count;
    }
  for (const auto& w : want) expected += (expected.empty() ? "" : ", ") + w.feature;
  for (auto& w : want) {
    MLFeatureDescription* d = got[ns(w.feature)];
    if (!d || count != want.size())
      throw bundle_error(where + ": " + role + "s [" + have + "] differ from the manifest's [" + expected + "]",
                         "re-export the bundle (the package does not belong to this manifest)");
    MLMultiArrayConstraint* c = d.multiArrayConstraint;
    if (d.type != MLFeatureTypeMultiArray || !c || dims_of(c.shape) != w.dims || !dtype_of(c.dataType, &w.type))
      throw bundle_error(where + ": " + role + " " + w.feature + " is not a multi-array of shape " +
                             dims_text(w.dims) + " (it has " + (c ? dims_text(dims_of(c.shape)) : "no shape") +
                             ") of float32, float16, float64 or int32",
                         FIX);
  }
}

}  // namespace

Feature feature(const std::string& contract, std::vector<int64_t> dims) {
  return Feature{contract, feature_name(contract), std::move(dims), DType::F32};
}

std::string os_version() { return text(NSProcessInfo.processInfo.operatingSystemVersionString); }

MLComputeUnits compute_units(const std::string& units) {
  if (units == "cpu") return MLComputeUnitsCPUOnly;
  if (units == "cpu_and_gpu") return MLComputeUnitsCPUAndGPU;
  if (units == "cpu_and_ne") return MLComputeUnitsCPUAndNeuralEngine;
  return MLComputeUnitsAll;  // "" | "all" (open_coreml checked the name)
}

std::string package_key(const Manifest& m, const std::string& rel) {
  std::string key = "coreml-compiled|" + rel + "|";
  for (const auto& f : m.files)  // std::map: sorted
    if (f.first.compare(0, rel.size() + 1, rel + "/") == 0) key += f.first + "=" + f.second.sha256 + ";";
  return sha256_hex(key + "|" + os_version()).substr(0, 32);
}

NSURL* compiled_package(const std::string& package, const std::string& key, bool fresh) {
  NSFileManager* fm = NSFileManager.defaultManager;
  NSURL* root = cache_root();
  NSURL* dest = root ? [root URLByAppendingPathComponent:ns(key + ".mlmodelc") isDirectory:YES] : nil;
  if (dest && fresh) [fm removeItemAtURL:dest error:nil];
  if (dest && [fm fileExistsAtPath:dest.path]) return dest;
  NSError* err = nil;
  NSURL* tmp = [MLModel compileModelAtURL:[NSURL fileURLWithPath:ns(package) isDirectory:YES] error:&err];
  if (!tmp)
    throw bundle_error(package + ": Core ML cannot compile this package (" + why(err) + ")",
                       std::string("update macOS / iOS to 15 / 18 or later, or ") + FIX);
  if (!dest || ![fm createDirectoryAtURL:root withIntermediateDirectories:YES attributes:nil error:nil]) return tmp;
  // staged beside the destination, then renamed: a reader never sees a half-copied .mlmodelc
  NSURL* staged = [root URLByAppendingPathComponent:ns(key + ".tmp-" + std::to_string(long(getpid())))
                                        isDirectory:YES];
  [fm removeItemAtURL:staged error:nil];
  if (![fm moveItemAtURL:tmp toURL:staged error:nil]) return tmp;  // the cache is not writable: use the temporary
  if ([fm moveItemAtURL:staged toURL:dest error:nil]) return dest;
  if ([fm fileExistsAtPath:dest.path]) {  // another process cached it first
    [fm removeItemAtURL:staged error:nil];
    return dest;
  }
  return staged;
}

Function load_function(NSURL* compiled, const std::string& package, const std::string& name, MLComputeUnits units,
                       std::vector<Feature> inputs, std::vector<Feature> outputs) {
  MLModelConfiguration* config = [[MLModelConfiguration alloc] init];
  config.computeUnits = units;
  config.functionName = ns(name);
  NSError* err = nil;
  MLModel* model = [MLModel modelWithContentsOfURL:compiled configuration:config error:&err];
  if (!model)
    throw bundle_error(package + ": Core ML cannot load function '" + name + "' (" + why(err) + ")",
                       std::string("check that the package has it (python -m coremltools ...); ") + FIX);
  Function f;
  f.model = model;
  f.name = name;
  f.where = package + " (function " + name + ")";
  f.inputs = std::move(inputs);
  f.outputs = std::move(outputs);
  match(f.where, model.modelDescription.inputDescriptionsByName, f.inputs, "input");
  match(f.where, model.modelDescription.outputDescriptionsByName, f.outputs, "output");
  return f;
}

void check_states(const Function& f, const std::map<std::string, std::vector<int64_t>>& states) {
  NSDictionary<NSString*, MLFeatureDescription*>* got = f.model.modelDescription.stateDescriptionsByName;
  bool same = got.count == states.size();
  for (const auto& s : states) {
    MLFeatureDescription* d = got[ns(s.first)];
    same = same && d && d.stateConstraint && dims_of(d.stateConstraint.bufferShape) == s.second;
  }
  if (!same) {
    std::string have, want;
    for (NSString* name in got) have += (have.empty() ? "" : ", ") + text(name);
    for (const auto& s : states) want += (want.empty() ? "" : ", ") + s.first + " " + dims_text(s.second);
    throw bundle_error(f.where + ": states [" + have + "] differ from the manifest's [" + want + "]",
                       std::string("every function must declare the same states (one MLState serves them all); ") +
                           FIX);
  }
}

id<MLFeatureProvider> Function::run(const Feeds& feeds, MLState* state, double* kernel_s) const {
  NSMutableDictionary<NSString*, id>* values = [NSMutableDictionary dictionaryWithCapacity:inputs.size()];
  for (const auto& f : inputs) {
    auto it = feeds.find(f.contract);
    if (it == feeds.end())
      throw backend_error(where + ": the runner has no value for input " + f.feature,
                          "report this; " + std::string(FIX));
    values[ns(f.feature)] = [MLFeatureValue featureValueWithMultiArray:input_array(it->second, f, where)];
  }
  NSError* err = nil;
  MLDictionaryFeatureProvider* in = [[MLDictionaryFeatureProvider alloc] initWithDictionary:values error:&err];
  if (!in) throw backend_error(where + ": Core ML refused the inputs (" + why(err) + ")", FIX);
  const double start = now_s();
  id<MLFeatureProvider> out = state ? [model predictionFromFeatures:in usingState:state error:&err]
                                    : [model predictionFromFeatures:in error:&err];
  *kernel_s += now_s() - start;
  if (!out)
    throw backend_error(where + ": Core ML prediction failed (" + why(err) + ")",
                        "check the bundle with `edge-spec check --bundle B`, or try --compute-units cpu; " +
                            std::string(FIX));
  return out;
}

template <typename Out>
void read_box(const Function& fn, id<MLFeatureProvider> out, const std::string& contract, const Box& box, Out* dst) {
  const std::string name = feature_name(contract);
  MLMultiArray* a = [out featureValueForName:ns(name)].multiArrayValue;
  DType type;
  if (!a || !dtype_of(a.dataType, &type))
    throw backend_error(fn.where + ": the prediction has no readable multi-array output " + name, FIX);
  StridedView view{nullptr, type, dims_of(a.shape), dims_of(a.strides)};
  __block std::string error;
  [a getBytesWithHandler:^(const void* bytes, NSInteger size) {
    try {  // no C++ exception may unwind through Core ML's frames
      StridedView v = view;
      v.data = bytes;
      v.bytes = size_t(size);
      copy_box(v, box, dst);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }];
  if (!error.empty()) throw backend_error(fn.where + ": output " + name + ": " + error, FIX);
}

void Function::read(id<MLFeatureProvider> out, const std::string& contract, const Box& box, float* dst) const {
  read_box(*this, out, contract, box, dst);
}

void Function::read(id<MLFeatureProvider> out, const std::string& contract, const Box& box, int64_t* dst) const {
  read_box(*this, out, contract, box, dst);
}

}  // namespace coreml
}  // namespace es

#endif  // ES_HAVE_COREML
