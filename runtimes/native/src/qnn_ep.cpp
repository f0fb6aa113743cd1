// qnn_ep.cpp - see qnn_ep.h. Compiled only with ES_HAVE_ORT (an empty file otherwise).
#ifdef ES_HAVE_ORT
#include "qnn_ep.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <unordered_map>

#include "errors.h"
#include "ort_common.h"

#ifndef ES_QNN_EP_DEFAULT  // CMakeLists.txt: ES_PYTHON's onnxruntime_qnn.get_library_path() at configure time
#define ES_QNN_EP_DEFAULT ""
#endif
#ifndef ES_QNN_EP_VERSION  // ... and its version ("2.7.0 (QNN 2.51.0)")
#define ES_QNN_EP_VERSION ""
#endif

namespace es {

const char* const QNN_EP_NAME = "QNNExecutionProvider";
const char* const QNN_EP_ENV = "EDGE_SPEC_QNN_EP";
const char* const QNN_INSTALL_FIX =
    "pip install onnxruntime-qnn==2.7.0 (x86-64 Linux; on a phone: onnxruntime's QNN build) and rebuild (make native) "
    "or point EDGE_SPEC_QNN_EP / --qnn-ep at its libonnxruntime_providers_qnn.so; or run the bundle's QDQ graphs on "
    "the CPU: --provider cpu";

namespace {

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::vector<Ort::ConstEpDevice> devices_of(const Ort::Env& env) {
  std::vector<Ort::ConstEpDevice> out;
  for (const auto& d : env.GetEpDevices())
    if (std::string(d.EpName()) == QNN_EP_NAME) out.push_back(d);
  return out;
}

}  // namespace

std::string qnn_ep_library(const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  const char* env = std::getenv(QNN_EP_ENV);
  if (env && *env) return env;
  return ES_QNN_EP_DEFAULT;
}

std::vector<Ort::ConstEpDevice> qnn_devices(Ort::Env& env, const std::string& library) {
  std::vector<Ort::ConstEpDevice> devices = devices_of(env);
  if (!devices.empty()) return devices;  // registered by an earlier open in this process (one Env per process)
  if (library.empty())
    throw backend_error("the QNN execution provider is not installed (this runner was built without a default plugin "
                        "library: CMake found no onnxruntime_qnn package in ES_PYTHON, and " +
                            std::string(QNN_EP_ENV) + " is not set)",
                        QNN_INSTALL_FIX);
  if (!is_file(library))
    throw backend_error("the QNN execution provider is not installed: no plugin library " + library, QNN_INSTALL_FIX);
  try {
    env.RegisterExecutionProviderLibrary(QNN_EP_NAME, library);
    devices = devices_of(env);
  } catch (const Ort::Exception& err) {
    throw backend_error("onnxruntime " + ort::version() + " could not load the QNN plugin " + library + " (" +
                            ort::first_line(err.what()) + ")",
                        QNN_INSTALL_FIX);
  }
  if (devices.empty())
    throw backend_error("onnxruntime lists no QNN device on this machine (plugin " + library + ")", QNN_INSTALL_FIX);
  return devices;
}

std::string qnn_ep_version(const std::vector<Ort::ConstEpDevice>& devices) {
  std::string library, version;  // as the devices report them (the plugin's own version is its EP API's, e.g. 0.1.0)
  for (const auto& d : devices) {
    const char* path = d.EpMetadata().GetValue("library_path");  // kOrtEpDevice_EpMetadataKey_LibraryPath
    const char* v = d.EpMetadata().GetValue("version");          // kOrtEpDevice_EpMetadataKey_Version
    if (path && *path) library = path;
    if (v && *v) version = v;
  }
  const std::string baked = ES_QNN_EP_VERSION;
  if (!baked.empty() && (library.empty() || library == ES_QNN_EP_DEFAULT)) return "onnxruntime-qnn " + baked;
  return "QNN EP plugin " + (library.empty() ? std::string("(path unknown)") : library) +
         (version.empty() ? "" : " (EP version " + version + ")");
}

Ort::SessionOptions qnn_session_options(Ort::Env& env, const std::vector<Ort::ConstEpDevice>& devices,
                                        const QnnSoc& soc, int threads) {
  Ort::SessionOptions so;
  so.SetLogSeverityLevel(3);
  so.AddConfigEntry("session.disable_cpu_ep_fallback", "1");
  so.AddConfigEntry("session.record_ep_graph_assignment_info", "1");
  if (threads > 0) so.SetIntraOpNumThreads(threads);
  const std::unordered_map<std::string, std::string> options = {
      {"backend_type", "htp"},
      {"soc_model", std::to_string(soc.soc_model)},
      {"htp_arch", std::to_string(soc.htp_arch)},
      {"htp_performance_mode", "burst"},
      {"offload_graph_io_quantization", "0"}};
  so.AppendExecutionProvider_V2(env, devices, options);
  return so;
}

std::vector<std::string> off_htp_nodes(const Ort::Session& session) {
  std::vector<std::string> out;
  for (const auto& sub : session.GetEpGraphAssignmentInfo())
    if (sub.GetEpName() != QNN_EP_NAME)
      for (const auto& node : sub.GetNodes()) out.push_back(node.GetOperatorType() + " " + node.GetName());
  return out;
}

}  // namespace es

#endif  // ES_HAVE_ORT
