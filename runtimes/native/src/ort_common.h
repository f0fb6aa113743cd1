// ort_common.h - what the backends over onnxruntime's C++ API share (ort_backend.cpp: onnx bundles on the CPU
// provider; qnn_backend.cpp: qnn bundles on the QNN execution provider or the CPU one): the API version check, tensors
// over caller-owned buffers, opening a session and running one with every onnxruntime exception turned into an
// es::Error naming the file and the fix, and the graph's IO as onnxruntime reports it.
//
// Include only where ES_HAVE_ORT is defined (CMakeLists.txt defines it when it found onnxruntime).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

#include "manifest.h"

namespace es {
namespace ort {

double now_s();
std::string first_line(const std::string& s);  // onnxruntime's message, its first line, at most 300 characters
std::string version();                          // the loaded library's ("1.32.0")

// Throws Error(Code::Backend) when the loaded library cannot serve the API version the runner was built against.
void check_api();

// A tensor over `data` (not copied, not owned: the buffer must outlive the value); shape as given.
Ort::Value tensor(const Ort::MemoryInfo& cpu, float* data, const std::vector<int64_t>& shape);
Ort::Value tensor(const Ort::MemoryInfo& cpu, int64_t* data, const std::vector<int64_t>& shape);
Ort::Value tensor(const Ort::MemoryInfo& cpu, int32_t* data, const std::vector<int64_t>& shape);

std::vector<std::string> io_names(const std::vector<TensorSpec>& specs);

// Opens `path` with `so`; a failure is Error(Code::Bundle) "<path>: onnxruntime <v> cannot load this graph (<why>)"
// with `fix`, unless `explain` (given onnxruntime's message) throws a more precise error first.
Ort::Session open_session(Ort::Env& env, const std::string& path, const Ort::SessionOptions& so,
                          const std::string& fix, const std::function<void(const std::string&)>& explain = nullptr);

// Runs with every input and output given by name (`in_names` / `out_names`: the order to pass them in); outputs are
// preallocated (written in place). A failure is Error(Code::Backend) naming `path` and `fix`.
void run(Ort::Session& session, const std::vector<std::string>& in_names, std::map<std::string, Ort::Value>& in,
         const std::vector<std::string>& out_names, std::map<std::string, Ort::Value>& out, const std::string& path,
         const std::string& fix);

// One graph input or output as the loaded session reports it.
struct TensorInfo {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;  // symbolic dims: -1
};
struct SessionIO {
  std::vector<std::string> input_names, output_names;  // the graph's order
  std::map<std::string, TensorInfo> inputs, outputs;
};
SessionIO session_io(Ort::Session& session);

std::string type_name(ONNXTensorElementDataType type);  // "float32", "int32", "int64", or the enum's number
std::string shape_text(const std::vector<int64_t>& shape);  // "[1, 5, 64]"

}  // namespace ort
}  // namespace es
