// ort_common.cpp - see ort_common.h. Compiled only with ES_HAVE_ORT (an empty file otherwise, like ort_backend.cpp).
#ifdef ES_HAVE_ORT
#include "ort_common.h"

#include <chrono>

#include "errors.h"

namespace es {
namespace ort {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string first_line(const std::string& s) {
  const std::string line = s.substr(0, s.find('\n'));
  return line.size() > 300 ? line.substr(0, 300) : line;
}

std::string version() { return OrtGetApiBase()->GetVersionString(); }

void check_api() {
  if (!OrtGetApiBase()->GetApi(ORT_API_VERSION))  // a library older than the headers the runner was built with
    throw backend_error("onnxruntime " + version() + " does not serve API version " + std::to_string(ORT_API_VERSION) +
                            " (this runner's headers)",
                        "install onnxruntime >= 1." + std::to_string(ORT_API_VERSION) + " and rebuild: make native");
}

namespace {
size_t count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}
}  // namespace

Ort::Value tensor(const Ort::MemoryInfo& cpu, float* data, const std::vector<int64_t>& shape) {
  return Ort::Value::CreateTensor<float>(cpu, data, count(shape), shape.data(), shape.size());
}

Ort::Value tensor(const Ort::MemoryInfo& cpu, int64_t* data, const std::vector<int64_t>& shape) {
  return Ort::Value::CreateTensor<int64_t>(cpu, data, count(shape), shape.data(), shape.size());
}

Ort::Value tensor(const Ort::MemoryInfo& cpu, int32_t* data, const std::vector<int64_t>& shape) {
  return Ort::Value::CreateTensor<int32_t>(cpu, data, count(shape), shape.data(), shape.size());
}

std::vector<std::string> io_names(const std::vector<TensorSpec>& specs) {
  std::vector<std::string> out;
  for (const auto& s : specs) out.push_back(s.name);
  return out;
}

Ort::Session open_session(Ort::Env& env, const std::string& path, const Ort::SessionOptions& so,
                          const std::string& fix, const std::function<void(const std::string&)>& explain) {
  try {
    return Ort::Session(env, path.c_str(), so);
  } catch (const Ort::Exception& err) {
    if (explain) explain(err.what());
    throw bundle_error(path + ": onnxruntime " + version() + " cannot load this graph (" + first_line(err.what()) + ")",
                       fix);
  }
}

void run(Ort::Session& session, const std::vector<std::string>& in_names, std::map<std::string, Ort::Value>& in,
         const std::vector<std::string>& out_names, std::map<std::string, Ort::Value>& out, const std::string& path,
         const std::string& fix) {
  std::vector<Ort::Value> inputs, outputs;
  for (const auto& n : in_names) inputs.push_back(std::move(in.at(n)));
  for (const auto& n : out_names) outputs.push_back(std::move(out.at(n)));
  std::vector<const char*> ic, oc;
  for (const auto& n : in_names) ic.push_back(n.c_str());
  for (const auto& n : out_names) oc.push_back(n.c_str());
  try {
    session.Run(Ort::RunOptions{nullptr}, ic.data(), inputs.data(), inputs.size(), oc.data(), outputs.data(),
                outputs.size());
  } catch (const Ort::Exception& err) {
    throw backend_error(path + ": onnxruntime failed to run the graph (" + first_line(err.what()) + ")", fix);
  }
}

SessionIO session_io(Ort::Session& session) {
  Ort::AllocatorWithDefaultOptions alloc;
  SessionIO io;
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    io.input_names.push_back(session.GetInputNameAllocated(i, alloc).get());
    const Ort::TypeInfo type_info = session.GetInputTypeInfo(i);
    const auto info = type_info.GetTensorTypeAndShapeInfo();  // a view into type_info
    io.inputs[io.input_names.back()] = TensorInfo{info.GetElementType(), info.GetShape()};
  }
  for (size_t i = 0; i < session.GetOutputCount(); ++i) {
    io.output_names.push_back(session.GetOutputNameAllocated(i, alloc).get());
    const Ort::TypeInfo type_info = session.GetOutputTypeInfo(i);
    const auto info = type_info.GetTensorTypeAndShapeInfo();
    io.outputs[io.output_names.back()] = TensorInfo{info.GetElementType(), info.GetShape()};
  }
  return io;
}

std::string type_name(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    default: return "element type " + std::to_string(int(type));
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace ort
}  // namespace es

#endif  // ES_HAVE_ORT
