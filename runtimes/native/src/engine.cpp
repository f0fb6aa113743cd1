// engine.cpp - see engine.h.
#include "engine.h"

#include <algorithm>
#include <thread>

#include "contract_names.h"
#include "coreml_backend.h"
#include "errors.h"
#include "executorch_backend.h"
#include "json.h"
#ifdef ES_HAVE_ORT
#include "ort_backend.h"
#include "qnn_backend.h"
#endif

namespace es {

using namespace contract;  // the graph IO names and formats (contract_names.h, generated)

namespace {

// Whether this build has the backend of `format` (a row of format_rows(); CMakeLists.txt writes the same
// list to formats.txt).
bool built(const std::string& format) {
  if (format == FORMAT_EXECUTORCH) return true;
#ifdef ES_HAVE_ORT
  if (format == FORMAT_ONNX || format == FORMAT_QNN) return true;
#endif
#ifdef ES_HAVE_COREML
  if (format == FORMAT_COREML) return true;
#endif
  return false;
}

// The formats this build runs, in the order the refusal names them: executorch, onnx, qnn, coreml.
std::vector<std::string> built_formats() {
  std::vector<std::string> out;
  for (const char* format : {FORMAT_EXECUTORCH, FORMAT_ONNX, FORMAT_QNN,
                             FORMAT_COREML})
    if (built(format)) out.push_back(format);
  return out;
}

// The manifest's format picks the backend; a format this build has no runtime for is refused naming the fix, and so
// is a provider the format's backend does not have.
std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_backend(const std::string& folder,
                                                                                  const Manifest& m,
                                                                                  const OpenOptions& o) {
  if (m.format != FORMAT_QNN && !o.provider.empty() && !(m.format == FORMAT_ONNX && o.provider == "cpu"))
    throw config_error("the native " + m.format + " backend has no provider '" + o.provider + "'" +
                           (m.format == FORMAT_ONNX ? " (it runs onnxruntime's CPU provider)" : ""),
                       m.format == FORMAT_ONNX ? "drop --provider, or run the bundle with the Python runtime: edge-spec "
                                            "generate --bundle " + folder + " --provider " + o.provider
                                          : std::string("drop --provider (it chooses qnn bundles' qnn | cpu)"));
  if (m.format == FORMAT_EXECUTORCH) return open_executorch(folder, m, o.threads);
#ifdef ES_HAVE_ORT
  if (m.format == FORMAT_ONNX) return open_ort(folder, m, o.threads);
  if (m.format == FORMAT_QNN) return open_qnn(folder, m, o.threads, QnnOptions{o.provider, o.qnn_ep});
#endif
#ifdef ES_HAVE_COREML
  if (m.format == FORMAT_COREML) return open_coreml(folder, m, o.compute_units);  // threads: not Core ML's (coreml.py)
#endif
  const std::vector<std::string> formats = built_formats();
  std::string runs, flags;
  for (size_t i = 0; i < formats.size(); ++i) {
    runs += (i == 0 ? "" : i + 1 == formats.size() ? " and " : ", ") + formats[i];
    flags += (i ? "|" : "") + formats[i];
  }
  runs += " bundles";
#ifndef ES_HAVE_ORT
  runs += "; it was built without onnxruntime";
#endif
  std::string fix = "export the bundle with --format " + flags + ", or run it with the Python runtime: edge-spec "
                    "generate --bundle " + folder;
#ifndef ES_HAVE_ORT
  if (m.format == FORMAT_ONNX || m.format == FORMAT_QNN)
    fix = "rebuild the runner with onnxruntime (make native with npm installed: apt-get install npm; the CMake "
          "warning says what was missing), or run it with the Python runtime: edge-spec generate --bundle " + folder;
#endif
#ifndef ES_HAVE_COREML
  if (m.format == FORMAT_COREML)
    fix = "run it with a macOS or iOS build of this runner (CMake compiles the Core ML backend on Apple platforms: "
          "runtimes/native/README.md), or with the Python runtime on a Mac: edge-spec generate --bundle " + folder +
          "; or export the bundle with --format " + flags;
#endif
  throw bundle_error(join_path(folder, MANIFEST_FILE) + ": this native runner has no runtime for '" + m.format +
                         "' bundles (it runs " + runs + ")",
                     fix);
}

// A format's own open option given for another format's bundle is refused, as edge_spec.contract.formats
// check_options refuses it (--compute-units is the coreml row's).
void check_open_options(const Manifest& m, const OpenOptions& o) {
  if (o.compute_units.empty()) return;
  if (m.format != FORMAT_COREML)
    throw config_error("--compute-units applies to coreml bundles, not the native-" + m.format + " runtime",
                       "drop --compute-units");
  check_compute_units(o.compute_units);
}

}  // namespace

int cap_threads(int threads, std::string* notice) {
  const unsigned cores = std::thread::hardware_concurrency();  // 0: unknown
  if (threads <= 0 || cores == 0 || unsigned(threads) <= cores) return threads;
  if (notice)
    *notice = "--threads " + std::to_string(threads) + " is more than this machine's " + std::to_string(cores) +
              " cores; using " + std::to_string(cores);
  return int(cores);
}

std::unique_ptr<Engine> Engine::open(const std::string& folder, const OpenOptions& given) {
  if (given.threads < 0)
    throw config_error("threads must be >= 0 (0: the runtime's default), got " + std::to_string(given.threads),
                       "pass threads 0, or 1 up to this machine's core count");
  OpenOptions options = given;
  options.threads = cap_threads(given.threads);
  std::unique_ptr<Engine> e(new Engine());
  e->folder_ = folder;
  e->manifest_ = read_manifest(folder, options.verify_checksums);
  check_open_options(e->manifest_, options);
  auto pair = open_backend(folder, e->manifest_, options);
  e->backend_ = std::move(pair.first);
  e->drafter_ = std::move(pair.second);
  e->datastore_ = open_bundle_datastore(folder, e->manifest_);
  e->session_.reset(new Session(*e->backend_));
  for (int id : e->manifest_.eos_token_ids) e->stop_ids_.insert(id);
  if (options.host_check && e->drafter_) e->check_host(options.fresh_check);
  return e;
}

std::string Engine::artifact_id() const {
  std::string key = "native-bundle:";
  for (const auto& f : manifest_.files) key += f.first + "=" + f.second.sha256 + ";";  // std::map: sorted
  return key + manifest_.raw.at("kv").at("layout").dump();
}

const HostCheck& Engine::check_host(bool fresh) {
  const int max_t = std::min((manifest_.max_draft_len ? manifest_.max_draft_len : 4) + 1, 9);
  exactness_ = checked(*session_, manifest_.vocab_size, artifact_id(), max_t, fresh, &exactness_cached_);
  session_->min_rows = exactness_->min_rows() ? exactness_->min_rows() : 1;
  return *exactness_;
}

Generation Engine::generate(const std::vector<int64_t>& prompt, const GenerateOptions& o, const TokenSink& on_token) {
  check_sampling(o.sampling);  // validates before any work
  check_request(prompt, o.max_new_tokens, session_->max_context());
  for (int64_t id : prompt)
    if (id < 0 || id >= manifest_.vocab_size)
      throw config_error("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(manifest_.vocab_size) + ")",
                         "pass ids the bundle's tokenizer produced");
  PortableRng rng(o.seed);
  const std::set<int64_t> stop_ids = o.ignore_eos ? std::set<int64_t>() : stop_ids_;
  Generation g;
  bool speculative = o.spec && (drafter_ != nullptr || o.drafter != nullptr);
  if (speculative) {  // bad speculative arguments fail either way
    check_spec_args(o.spec_k, o.min_confidence);
    if (manifest_.max_draft_len && o.spec_k > manifest_.max_draft_len)
      throw config_error("spec_k " + std::to_string(o.spec_k) + " exceeds this bundle's max draft length " +
                             std::to_string(manifest_.max_draft_len),
                         "use --spec-k " + std::to_string(manifest_.max_draft_len) +
                             " or less, or re-export with --max-draft-len");
    if (exactness_ && !exactness_->exact()) {
      g.notice = exactness_->summary();
      speculative = false;
    }
  }
  if (!speculative) {
    g.result = generate_plain(*session_, prompt, o.max_new_tokens, o.sampling, rng, stop_ids, on_token);
    return g;
  }
  SpecOptions spec{o.spec_k, o.adaptive, o.min_confidence, o.lookup, o.datastore ? datastore_.get() : nullptr,
                   o.accept_all};
  DrafterBackend& drafter = o.drafter ? *o.drafter : *drafter_;
  g.result = generate_speculative(*session_, drafter, prompt, o.max_new_tokens, o.sampling, rng, stop_ids,
                                  manifest_.vocab_size, spec, on_token);
  return g;
}

std::string Engine::bundle_info_json() const {
  const Manifest& m = manifest_;
  std::string out = "{\"format\":" + json_quote(m.format) + ",\"precision\":" + json_quote(m.precision) +
                    ",\"model\":" + json_quote(m.target_name) + ",\"max_context\":" + std::to_string(m.max_context()) +
                    ",\"max_draft_len\":" + std::to_string(m.max_draft_len) +
                    ",\"vocab_size\":" + std::to_string(m.vocab_size) +
                    ",\"drafter\":" + (drafter_ ? "true" : "false") +
                    ",\"runtime\":" + json_quote(backend_->identity()) +
                    ",\"host_check\":" + (exactness_ ? exactness_->to_json() : std::string("null")) + "}";
  return out;
}

}  // namespace es
