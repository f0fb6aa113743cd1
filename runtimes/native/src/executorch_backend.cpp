// executorch_backend.cpp - see executorch_backend.h.
#include "executorch_backend.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/platform/platform.h>

#include "errors.h"

#ifndef ES_EXECUTORCH_VERSION  // CMakeLists.txt reads it from the wheel; other builds (Android's) may not say
#define ES_EXECUTORCH_VERSION "unknown"
#endif

#if __has_include(<executorch/extension/threadpool/threadpool.h>)  // a source build of ExecuTorch (Android, iOS)
#include <executorch/extension/threadpool/threadpool.h>
#else
// The wheel ships libexecutorch_threadpool.so but not its header: these two members are all the runner calls.
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  size_t get_thread_count() const;
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool
#endif

namespace es {

int llama_ops_registered();  // llama_ops.cpp

namespace {

using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::extension::make_tensor_ptr;
using executorch::runtime::EValue;
using ScalarType = executorch::aten::ScalarType;

const char* const FIX = "re-export the bundle: edge-spec export --format executorch --out DIR";

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string error_text(executorch::runtime::Error e) { return "executorch error " + std::to_string(int(e)); }

// The first `b` cache columns and the T new-row columns of a [T, S + T] mask -> [1, 1, T, b + T].
TensorPtr sliced_mask(const Mask& m, int slots, int b) {
  const int t = m.rows;
  std::vector<float> out(size_t(t) * (b + t));
  for (int r = 0; r < t; ++r) {
    const float* row = m.data.data() + size_t(r) * m.cols;
    float* dst = out.data() + size_t(r) * (b + t);
    std::memcpy(dst, row, sizeof(float) * size_t(b));
    std::memcpy(dst + b, row + slots, sizeof(float) * size_t(t));
  }
  return make_tensor_ptr({1, 1, t, b + t}, std::move(out));
}

struct Program {  // the Module, shared by both methods (it must outlive them)
  std::unique_ptr<Module> module;
  std::string path;
};

class ExecutorchBackend : public Backend {
 public:
  ExecutorchBackend(std::shared_ptr<Program> program, std::string method, const Manifest& m, std::string identity)
      : program_(std::move(program)), method_(std::move(method)), layout_(m.layout), vocab_(m.vocab_size),
        hidden_(m.hidden_size), identity_(std::move(identity)), logit_rows_(has_logit_rows(m.graphs.at("target").io)) {}

  const KVLayout& layout() const override { return layout_; }
  int vocab_size() const override { return vocab_; }
  int hidden_size() const override { return hidden_; }
  std::string identity() const override { return identity_; }
  int bucket_size() const override { return ET_BUCKET; }

  StepOutput forward(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const Masks& masks,
                     int64_t n_cached, bool last_only) override {
    const int t = int(ids.size());
    std::vector<TensorPtr> keep;  // the input tensors must live until execute returns
    keep.push_back(make_tensor_ptr({1, t}, std::vector<int64_t>(ids)));        // input_ids [1, T]
    keep.push_back(make_tensor_ptr({1, t}, std::vector<int64_t>(positions)));  // position_ids [1, T]
    for (const auto& kind : layout_.kinds()) {  // mask.<kind> [1, 1, T, S + T] -> the attended [1, 1, T, b + T]
      const int s = layout_.slots(kind);
      const int b = bucket_slots(int(std::min<int64_t>(s, n_cached + t)), s, ET_BUCKET);
      keep.push_back(sliced_mask(masks.at(kind), s, b));
    }
    const bool last = last_only && t > 1 && logit_rows_;  // the method runs the head on the last row only
    if (logit_rows_) {  // LOGIT_ROWS [R]: T - 1 alone, or every row
      std::vector<int64_t> rows;
      for (int i = last ? t - 1 : 0; i < t; ++i) rows.push_back(i);
      const int64_t r = int64_t(rows.size());
      keep.push_back(make_tensor_ptr({r}, std::move(rows)));
    }
    std::vector<EValue> inputs;
    for (auto& p : keep) inputs.emplace_back(*p);
    const double start = now_s();
    auto result = program_->module->execute(method_, inputs);
    kernel_s += now_s() - start;
    if (!result.ok())
      throw backend_error(program_->path + ": method '" + method_ + "' failed (" + error_text(result.error()) + ")",
                          "check the bundle with `edge-spec check --bundle B`; " + std::string(FIX));
    const auto& logits = result.get()[0].toTensor();  // [1, R, V] (R = T, or 1: `last`); aliases the arena: copy now
    const auto& hidden = result.get()[1].toTensor();  // [1, R, H]
    const int r = last ? 1 : t;
    const int first = last_only ? r - 1 : 0;
    StepOutput out;
    out.rows = r - first;
    const float* lp = logits.const_data_ptr<float>();
    const float* hp = hidden.const_data_ptr<float>();
    out.logits.assign(lp + size_t(first) * vocab_, lp + size_t(r) * vocab_);
    out.hidden.assign(hp + size_t(first) * hidden_, hp + size_t(r) * hidden_);
    return out;
  }

  void commit(const CommitPlan&) override {}  // the program wrote every row; KVState records which it accepted
  void reset() override {}                    // stale rows stay in the buffers; KVState's masks hide them

 private:
  std::shared_ptr<Program> program_;
  std::string method_;
  KVLayout layout_;
  int vocab_, hidden_;
  std::string identity_;
  bool logit_rows_;  // the method takes LOGIT_ROWS (programs exported since 2026-12-05)
};

class ExecutorchDrafter : public DrafterBackend {
 public:
  ExecutorchDrafter(std::shared_ptr<Program> program, std::string method, const Manifest& m)
      : program_(std::move(program)), method_(std::move(method)), layout_(m.layout), hidden_(m.hidden_size) {
    for (const auto& share : m.drafter->kv_sharing) kinds_.push_back(share.first);  // std::map: sorted by kind
  }

  void begin(int64_t position, const Masks& masks, int64_t n_cached) override {
    position_ = position;
    masks_.clear();
    for (const auto& kind : kinds_) {  // the committed keys: the first b slots hold them all -> [1, 1, 1, b]
      const int s = layout_.slots(kind);
      const int b = bucket_slots(int(std::min<int64_t>(s, n_cached)), s, ET_BUCKET);
      const Mask& m = masks.at(kind);
      masks_.push_back(make_tensor_ptr({1, 1, 1, b}, std::vector<float>(m.data.begin(), m.data.begin() + b)));
    }
  }

  DraftStep step(int64_t token, const std::vector<float>& hidden) override {
    std::vector<TensorPtr> keep = {make_tensor_ptr({1, 1}, std::vector<int64_t>{token}),     // input_ids [1, 1]
                                   make_tensor_ptr({1, 1, hidden_}, std::vector<float>(hidden)),  // hidden [1, 1, H]
                                   make_tensor_ptr({1, 1}, std::vector<int64_t>{position_})};  // position_ids [1, 1]
    std::vector<EValue> inputs;
    for (auto& p : keep) inputs.emplace_back(*p);
    for (auto& p : masks_) inputs.emplace_back(*p);
    const double start = now_s();
    auto result = program_->module->execute(method_, inputs);
    kernel_s += now_s() - start;
    if (!result.ok())
      throw backend_error(program_->path + ": method '" + method_ + "' failed (" + error_text(result.error()) + ")",
                          FIX);
    const auto& ids = result.get()[0].toTensor();     // [N] int64
    const auto& logits = result.get()[1].toTensor();  // [N] float32
    const auto& next = result.get()[2].toTensor();    // [1, 1, H]
    DraftStep out;
    const int64_t* ip = ids.const_data_ptr<int64_t>();
    const float* lp = logits.const_data_ptr<float>();
    const float* hp = next.const_data_ptr<float>();
    out.token_ids.assign(ip, ip + ids.numel());
    out.logits.assign(lp, lp + logits.numel());
    out.hidden.assign(hp, hp + hidden_);
    return out;
  }

 private:
  std::shared_ptr<Program> program_;
  std::string method_;
  KVLayout layout_;
  int hidden_;
  std::vector<std::string> kinds_;
  int64_t position_ = 0;
  std::vector<TensorPtr> masks_;
};

void load_method(Program& program, const std::string& name, size_t n_inputs, size_t n_outputs) {
  auto names = program.module->method_names();
  if (!names.ok())
    throw bundle_error(program.path + ": executorch cannot load this program (" + error_text(names.error()) + ")",
                       std::string("the file is not a valid .pte for this runtime; ") + FIX);
  if (!names.get().count(name)) {
    std::string have;
    for (const auto& n : names.get()) have += (have.empty() ? "" : ", ") + n;
    throw bundle_error(program.path + " has no method '" + name + "' (it has " + have + ")", FIX);
  }
  auto meta = program.module->method_meta(name);
  if (!meta.ok() || meta->num_inputs() != n_inputs || meta->num_outputs() != n_outputs)
    throw bundle_error(program.path + ": method '" + name + "' takes " +
                           (meta.ok() ? std::to_string(meta->num_inputs()) : "?") + " inputs and returns " +
                           (meta.ok() ? std::to_string(meta->num_outputs()) : "?") + ", the manifest says " +
                           std::to_string(n_inputs) + " and " + std::to_string(n_outputs),
                       FIX);
  auto err = program.module->load_method(name);
  if (err != executorch::runtime::Error::Ok)
    throw bundle_error(program.path + ": executorch cannot load method '" + name + "' (" + error_text(err) +
                           "; a missing operator is named in the log above)",
                       FIX);
}

// ExecuTorch's log: errors (a missing operator, a failed delegate) always; its info lines (cpuinfo probing) only with
// ES_VERBOSE=1 in the environment.
void emit_log(et_timestamp_t, et_pal_log_level_t level, const char* filename, const char*, size_t line,
              const char* message, size_t length) {
  static const bool verbose = std::getenv("ES_VERBOSE") && std::strcmp(std::getenv("ES_VERBOSE"), "0") != 0;
  if (!verbose && (level == kDebug || level == kInfo)) return;
  std::fprintf(stderr, "executorch %c %s:%zu] %.*s\n", char(level), filename ? filename : "?", line, int(length), message);
}

void quiet_logs() {
  static const bool done = executorch::runtime::register_pal(
      executorch::runtime::PalImpl::create(emit_log, __FILE__));
  (void)done;
}

int set_threads(int threads) {
  auto* pool = executorch::extension::threadpool::get_threadpool();
  if (!pool) return 1;
  if (threads > 0 && size_t(threads) != pool->get_thread_count()) pool->_unsafe_reset_threadpool(uint32_t(threads));
  return int(pool->get_thread_count());
}

}  // namespace

std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_executorch(const std::string& folder,
                                                                                     const Manifest& m,
                                                                                     int threads) {
  (void)llama_ops_registered();
  quiet_logs();
  if (threads < 0) throw config_error("threads must be >= 0, got " + std::to_string(threads), "use --threads 2");
  const GraphEntry& entry = m.graphs.at("target");
  auto program = std::make_shared<Program>();
  program->path = join_path(folder, entry.file);
  program->module = std::make_unique<Module>(program->path, Module::LoadMode::Mmap, nullptr, nullptr, nullptr,
                                             /*share_memory_arenas=*/true);
  auto err = program->module->load();
  if (err != executorch::runtime::Error::Ok)
    throw bundle_error(program->path + ": executorch cannot load this program (" + error_text(err) + ")",
                       std::string("the file is not a valid .pte for this runtime; ") + FIX);
  const int count = set_threads(threads);
  load_method(*program, entry.method, entry.io.inputs.size(), entry.io.outputs.size());
  std::string identity =
      std::string("executorch ") + ES_EXECUTORCH_VERSION + " (native), XNNPACK, " + std::to_string(count) + " threads";
  std::unique_ptr<Backend> backend(new ExecutorchBackend(program, entry.method, m, identity));
  std::unique_ptr<DrafterBackend> drafter;
  if (m.drafter) {
    const GraphEntry& d = m.graphs.at("drafter");
    if (d.file != entry.file)
      throw bundle_error(join_path(folder, d.file) + ": the drafter method must live in the target's program " +
                             entry.file + " (they share the KV buffers)",
                         FIX);
    load_method(*program, d.method, d.io.inputs.size(), d.io.outputs.size());
    drafter.reset(new ExecutorchDrafter(program, d.method, m));
  }
  return {std::move(backend), std::move(drafter)};
}

}  // namespace es
