// engine.h - one opened bundle: manifest (verified), the format's backend + drafter, the session, the host check;
// generate() picks plain or speculative decoding as edge_spec.api.Engine.generate does (the C API and the CLI both
// stand on this).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend.h"
#include "hostcheck.h"
#include "manifest.h"
#include "session.h"
#include "speculative.h"

namespace es {

struct OpenOptions {
  int threads = 0;              // 0: the backend's default (coreml bundles: Core ML picks its own)
  std::string compute_units;    // coreml bundles: all | cpu_and_ne | cpu_and_gpu | cpu ("": all); others refuse it
  bool verify_checksums = true;  // sha256 of every file in the manifest
  bool host_check = true;        // probe exactness at open (bundles with a drafter)
  bool fresh_check = false;      // probe even when a cached verdict exists (hostcheck.h `checked`)
  // The execution provider (the Python runtimes' --provider): qnn bundles "qnn" | "cpu" ("": $EDGE_SPEC_QNN_PROVIDER,
  // else "qnn"), onnx bundles "cpu" only ("": cpu); executorch bundles take none.
  std::string provider;
  std::string qnn_ep;  // the QNN EP plugin library ("": $EDGE_SPEC_QNN_EP, else the one found at build time)
};

// threads > this machine's cores (std::thread::hardware_concurrency) -> the core count, with `notice` set to "--threads
// N is more than this machine's C cores; using C" (threads <= 0, or an unknown core count: unchanged, no notice).
// Engine::open applies it to OpenOptions::threads (the C API's es_open_options.threads included); the CLI calls it
// first to print the notice. More threads than cores only make the decode's threads wait on each other.
int cap_threads(int threads, std::string* notice = nullptr);

struct GenerateOptions {
  int max_new_tokens = 128;
  SamplingParams sampling;
  uint64_t seed = 0;
  bool spec = true;  // speculative decoding when the bundle has a drafter (false: plain)
  int spec_k = 4;
  bool adaptive = false;
  double min_confidence = 0.3;  // adaptive only
  bool lookup = true;
  bool datastore = true;  // the bundle's static datastore drafts after prompt lookup, where it has one
  bool ignore_eos = false;  // no stop tokens (tests and benchmarks that need a fixed length)
  // A drafter standing in for the bundle's (null: the bundle's own), speculating even where the bundle has none;
  // the caller owns it. The test build's oracle drafter (test_hooks.h, edge-spec-run-test) is the one user.
  DrafterBackend* drafter = nullptr;
  bool accept_all = false;  // the test build's --test-accept-all (SpecOptions::accept_all): a wrong verifier
};

struct Generation {
  GenerationResult result;
  std::string notice;  // the host check's notice where it turned speculation off
};

class Engine {
 public:
  static std::unique_ptr<Engine> open(const std::string& folder, const OpenOptions& options);

  Generation generate(const std::vector<int64_t>& prompt, const GenerateOptions& options,
                      const TokenSink& on_token = nullptr);
  // The host check (cached per artifact, runtime and CPU unless `fresh`); sets the session's row mode from it.
  const HostCheck& check_host(bool fresh = false);
  bool exactness_cached() const { return exactness_cached_; }
  // What the host check is keyed on: every file's sha256 and the KV layout (as edge_spec.api.Engine.artifact_id).
  std::string artifact_id() const;

  const Manifest& manifest() const { return manifest_; }
  const std::string& folder() const { return folder_; }
  bool has_drafter() const { return drafter_ != nullptr; }
  bool has_datastore() const { return datastore_ != nullptr; }
  DrafterBackend* drafter() { return drafter_.get(); }  // null without one (its kernel clock: the CLI's --json)
  const std::set<int64_t>& stop_ids() const { return stop_ids_; }
  const std::optional<HostCheck>& exactness() const { return exactness_; }
  std::string runtime_name() const { return "native-" + manifest_.format; }
  Session& session() { return *session_; }
  std::string bundle_info_json() const;

 private:
  Engine() = default;
  std::string folder_;
  Manifest manifest_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DrafterBackend> drafter_;
  std::unique_ptr<Datastore> datastore_;  // the manifest's "datastore" (datastore.h); null without one
  std::unique_ptr<Session> session_;
  std::set<int64_t> stop_ids_;
  std::optional<HostCheck> exactness_;
  bool exactness_cached_ = false;
};

}  // namespace es
