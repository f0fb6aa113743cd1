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

#include "eagle3.h"
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

struct Program {  // the Module, shared by its methods (it must outlive them)
  std::unique_ptr<Module> module;
  std::string path;
};

// Runs `method` on `keep` (the input tensors, alive until it returns); adds its time to `kernel_s`.
std::vector<EValue> execute(Program& program, const std::string& method, const std::vector<TensorPtr>& keep,
                            double& kernel_s, const std::string& fix) {
  std::vector<EValue> inputs;
  for (const auto& p : keep) inputs.emplace_back(*p);
  const double start = now_s();
  auto result = program.module->execute(method, inputs);
  kernel_s += now_s() - start;
  if (!result.ok())
    throw backend_error(program.path + ": method '" + method + "' failed (" + error_text(result.error()) + ")", fix);
  return std::move(result.get());
}

class ExecutorchBackend : public Backend {
 public:
  ExecutorchBackend(std::shared_ptr<Program> program, std::string method, const Manifest& m, std::string identity)
      : aux_width(aux_size(m.graphs.at("target").io)), program_(std::move(program)), method_(std::move(method)),
        layout_(m.layout), vocab_(m.vocab_size), hidden_(m.hidden_size), identity_(std::move(identity)),
        logit_rows_(has_logit_rows(m.graphs.at("target").io)) {}

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
    const auto result = execute(*program_, method_, keep, kernel_s,
                                "check the bundle with `edge-spec check --bundle B`; " + std::string(FIX));
    const auto& logits = result[0].toTensor();  // [1, R, V] (R = T, or 1: `last`); aliases the arena: copy now
    const auto& hidden = result[1].toTensor();  // [1, R, H]
    if (aux_width && aux_record)  // an eagle3 program's AUX_HIDDEN [1, T, n * H], every row
      aux_record->record(ids.data(), positions.data(), result[2].toTensor().const_data_ptr<float>(), t);
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

  // An eagle3 program's target also returns AUX_HIDDEN [1, T, aux_width] (0: it does not); after each pass its rows
  // go to `aux_record` (set by the eagle3 drafter, which owns it), with the pass's ids and positions.
  const int aux_width;
  AuxRecord* aux_record = nullptr;

 private:
  std::shared_ptr<Program> program_;
  std::string method_;
  KVLayout layout_;
  int vocab_, hidden_;
  std::string identity_;
  bool logit_rows_;  // the method takes LOGIT_ROWS (programs exported since 2026-12-05)
};

// A drafter method's outputs (candidate ids [N] int64, their logits [N], the chained hidden [1, 1, H]) copied out of
// the arena.
DraftStep draft_step(const std::vector<EValue>& result, int hidden) {
  const auto& ids = result[0].toTensor();
  const auto& logits = result[1].toTensor();
  const float* hp = result[2].toTensor().const_data_ptr<float>();
  DraftStep out;
  const int64_t* ip = ids.const_data_ptr<int64_t>();
  const float* lp = logits.const_data_ptr<float>();
  out.token_ids.assign(ip, ip + ids.numel());
  out.logits.assign(lp, lp + logits.numel());
  out.hidden.assign(hp, hp + hidden);
  return out;
}

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
    keep.insert(keep.end(), masks_.begin(), masks_.end());
    return draft_step(execute(*program_, method_, keep, kernel_s, FIX), hidden_);
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

// An EAGLE-3 drafter over the program's `drafter` (step) and `drafter_fc` methods (runtimes/executorch.py
// ExecutorchEagle3Drafter): its cache is the program's own buffers (draft layout `state`), which the step method
// writes at each row's slot, position - 1; which rows a step runs: eagle3.h. A burst's first step runs its rows in
// chunks of at most the layout's max_pass (the methods' planned size).
class ExecutorchEagle3Drafter : public DrafterBackend {
 public:
  ExecutorchEagle3Drafter(std::shared_ptr<Program> program, std::string step, std::string fc,
                          ExecutorchBackend& target, const Manifest& m)
      : program_(std::move(program)), step_(std::move(step)), fc_(std::move(fc)), target_(target),
        hidden_(m.hidden_size), draft_(*m.drafter->draft_kv), record_(m.max_context(), target.aux_width),
        rows_(record_, draft_.max_context) {
    if (!target.aux_width)
      throw bundle_error(program_->path + ": the target method returns no " + std::string(contract::AUX_HIDDEN) +
                             ", which an eagle3 drafter reads",
                         FIX);
    target_.aux_record = &record_;
  }
  ~ExecutorchEagle3Drafter() override { target_.aux_record = nullptr; }

  // A burst after the target's committed positions [0, position); the target's masks are unused.
  void begin(int64_t position, const Masks&, int64_t) override { rows_.begin(position); }

  DraftStep step(int64_t token, const std::vector<float>& hidden) override {
    const Eagle3Rows::Rows rows = rows_.next(token);
    const int t = int(rows.ids.size());
    Eagle3Rows::check_room(rows, draft_.max_context);
    DraftStep out;
    if (rows.first) {  // the missing rows, max_pass at a time: fc over their aux states, then the step
      const int chunk = draft_.max_pass > 0 ? draft_.max_pass : t;
      const int width = record_.width;
      for (int a = 0; a < t; a += chunk) {
        const int n = std::min(chunk, t - a);
        const float* aux = record_.aux_rows(rows.aux_from + a);
        std::vector<TensorPtr> in = {make_tensor_ptr({1, n, width}, std::vector<float>(aux, aux + size_t(n) * width))};
        const auto fused = execute(*program_, fc_, in, kernel_s, FIX)[0].toTensor();  // [1, n, H]
        const float* x = fused.const_data_ptr<float>();
        out = run({rows.ids.begin() + a, rows.ids.begin() + a + n}, std::vector<float>(x, x + size_t(n) * hidden_),
                  rows.s + a);
      }
    } else {
      out = run(rows.ids, hidden, rows.s);
    }
    rows_.wrote(rows);
    return out;
  }

 private:
  // T rows after the s written ones: ids [T], hidden [T * H]; the mask [1, 1, T, b + T] shows the written slots
  // [0, s) and the new rows causally.
  DraftStep run(const std::vector<int64_t>& ids, std::vector<float> x, int64_t s) {
    const int t = int(ids.size()), slots = draft_.max_context;
    const int b = bucket_slots(int(std::min<int64_t>(slots, s + t)), slots, ET_BUCKET);
    std::vector<float> mask(size_t(t) * size_t(b + t), NEG_INF);
    std::vector<int64_t> positions(static_cast<size_t>(t));
    for (int r = 0; r < t; ++r) {
      float* row = mask.data() + size_t(r) * size_t(b + t);
      std::fill(row, row + s, 0.0f);
      std::fill(row + b, row + b + r + 1, 0.0f);
      positions[size_t(r)] = s + 1 + r;
    }
    std::vector<TensorPtr> in = {make_tensor_ptr({1, t}, std::vector<int64_t>(ids)),          // input_ids [1, T]
                                 make_tensor_ptr({1, t, hidden_}, std::move(x)),              // hidden [1, T, H]
                                 make_tensor_ptr({1, t}, std::move(positions)),               // position_ids [1, T]
                                 make_tensor_ptr({1, 1, t, b + t}, std::move(mask))};         // draft_mask
    return draft_step(execute(*program_, step_, in, kernel_s, FIX), hidden_);
  }

  std::shared_ptr<Program> program_;
  std::string step_, fc_;
  ExecutorchBackend& target_;
  int hidden_;
  KVLayout draft_;  // the drafter's own cache layout (`state`: the program's buffers, max_context + 1 slots)
  AuxRecord record_;
  Eagle3Rows rows_;
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
  if (entry.data.empty()) {  // programs exported before 2026-12-06 night keep their constants in the .pte
    program->module = std::make_unique<Module>(program->path, Module::LoadMode::Mmap, nullptr, nullptr, nullptr,
                                               /*share_memory_arenas=*/true);
  } else {  // the weights file (every constant once: exporters/executorch.py lower), memory-mapped too
    program->module = std::make_unique<Module>(program->path, join_path(folder, entry.data), Module::LoadMode::Mmap,
                                               nullptr, nullptr, nullptr, /*share_memory_arenas=*/true);
  }
  auto err = program->module->load();
  if (err != executorch::runtime::Error::Ok)
    throw bundle_error(program->path + ": executorch cannot load this program" +
                           (entry.data.empty() ? "" : " with its weights file " + entry.data) + " (" +
                           error_text(err) + ")",
                       std::string("the files are not a valid .pte / .ptd pair for this runtime; ") + FIX);
  const int count = set_threads(threads);
  load_method(*program, entry.method, entry.io.inputs.size(), entry.io.outputs.size());
  std::string identity =
      std::string("executorch ") + ES_EXECUTORCH_VERSION + " (native), XNNPACK, " + std::to_string(count) + " threads";
  auto* target = new ExecutorchBackend(program, entry.method, m, identity);
  std::unique_ptr<Backend> backend(target);
  std::unique_ptr<DrafterBackend> drafter;
  if (m.drafter) {
    std::vector<std::string> names = {"drafter"};
    if (m.drafter->is_eagle3()) names.push_back(contract::EAGLE3_FC_GRAPH);
    for (const auto& name : names) {
      const GraphEntry& d = m.graphs.at(name);
      if (d.file != entry.file)
        throw bundle_error(join_path(folder, d.file) + ": the " + name + " method must live in the target's " +
                               "program " + entry.file + " (they share its buffers)",
                           FIX);
      load_method(*program, d.method, d.io.inputs.size(), d.io.outputs.size());
    }
    const std::string& step = m.graphs.at("drafter").method;
    if (m.drafter->is_eagle3())
      drafter.reset(new ExecutorchEagle3Drafter(program, step, m.graphs.at(names[1]).method, *target, m));
    else
      drafter.reset(new ExecutorchDrafter(program, step, m));
  }
  return {std::move(backend), std::move(drafter)};
}

}  // namespace es
