// qnn_ep.h - onnxruntime's QNN execution provider for the qnn backend (qnn_backend.cpp), as runtimes/qnn_htp.py sets
// it up in Python: the `onnxruntime-qnn` wheel (2.7.0, QNN SDK 2.51) is a *plugin* EP, registered from its library
// (libonnxruntime_providers_qnn.so, which finds libQnnHtp.so etc. beside itself) with
// OrtApi::RegisterExecutionProviderLibrary and attached to a session with SessionOptionsAppendExecutionProvider_V2 on
// the devices it offers; CPU fallback disabled, so a graph that does not fully land on the HTP fails to open. On
// x86-64 the wheel simulates the HTP; on a Snapdragon phone the same calls reach its NPU.
//
// Include only where ES_HAVE_ORT is defined.
#pragma once

#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

namespace es {

extern const char* const QNN_EP_NAME;      // "QNNExecutionProvider": the plugin's EP (and its registration) name
extern const char* const QNN_EP_ENV;       // EDGE_SPEC_QNN_EP: the plugin library, overriding the build's default
extern const char* const QNN_INSTALL_FIX;  // pip install onnxruntime-qnn==2.7.0 ... or --provider cpu

// The SoC the bundle's context binaries were compiled for (the manifest's fixed.qnn: soc, soc_model, htp_arch).
struct QnnSoc {
  std::string name;
  int soc_model = 0;
  int htp_arch = 0;
};

// The plugin library to load: `explicit_path` (--qnn-ep), else $EDGE_SPEC_QNN_EP, else the path CMake found in
// ES_PYTHON's onnxruntime_qnn package at configure time ("" when it found none).
std::string qnn_ep_library(const std::string& explicit_path);

// The QNN EP's devices in `env`, registering `library` first unless an earlier open in this process did (the Env is
// one per process). Throws Error(Code::Backend) naming the library and QNN_INSTALL_FIX when it is missing, does not
// load, or offers no device.
std::vector<Ort::ConstEpDevice> qnn_devices(Ort::Env& env, const std::string& library);

// What runs: "onnxruntime-qnn 2.7.0 (QNN 2.51.0)" for the plugin CMake found (its wheel's version), else the plugin's
// path and the EP version its devices report.
std::string qnn_ep_version(const std::vector<Ort::ConstEpDevice>& devices);

// runtimes/qnn_htp.py session_options: the whole graph on the HTP of `soc` (CPU fallback disabled, the placement
// recorded for `off_htp_nodes`), burst performance mode, graph IO quantized inside the graph; `threads` intra-op
// threads (0: onnxruntime's default).
Ort::SessionOptions qnn_session_options(Ort::Env& env, const std::vector<Ort::ConstEpDevice>& devices,
                                        const QnnSoc& soc, int threads);

// runtimes/qnn_htp.py cpu_nodes: the nodes of a session opened with qnn_session_options that did not land on the
// QNN EP ("op_type name"); empty when fully placed.
std::vector<std::string> off_htp_nodes(const Ort::Session& session);

}  // namespace es
