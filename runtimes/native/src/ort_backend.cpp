// ort_backend.cpp - see ort_backend.h. Read top to bottom: the shared tables (mmap), sessions + the graph IO check
// (runtimes/ort.py make_session / check_graph_io), the target backend over the caches of io_caches.h, the drafter,
// open_ort. Every onnxruntime exception is turned into an es::Error here.
//
// Compiled only with ES_HAVE_ORT (CMakeLists.txt defines it when it found onnxruntime): builds that glob src/*.cpp
// without onnxruntime (android_demo's CMake) get an empty file, and engine.cpp refuses onnx bundles.
#ifdef ES_HAVE_ORT
#include "ort_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include <onnxruntime_cxx_api.h>

#include "contract_names.h"
#include "eagle3.h"
#include "errors.h"
#include "io_caches.h"
#include "ort_common.h"

namespace es {

using namespace contract;  // the graph IO names and formats (contract_names.h, generated)

namespace {

const char* const FIX = "re-export the bundle: edge-spec export --format onnx --out DIR";
const std::string RUN_FIX = "check the bundle with `edge-spec check --bundle B`; " + std::string(FIX);

using ort::io_names;
using ort::now_s;
using ort::tensor;

// ---- a shared table: raw little-endian float32 or uint8 (quantized codes, zero points), memory-mapped read-only ----------
struct Table {
  std::string name, path;
  std::vector<int64_t> shape;  // [V, H] float32, [V, H / 32, 32] uint8, [V * H / 32] float32 (its scales)
  const void* data = nullptr;
  size_t bytes = 0;
  bool u8 = false;
  Table() = default;
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  ~Table() {
    if (data) ::munmap(const_cast<void*>(data), bytes);
  }
};

std::unique_ptr<Table> map_table(const std::string& folder, const Manifest& m, const std::string& name) {
  const Json& entry = m.raw.at("tables").at(name);
  auto t = std::make_unique<Table>();
  t->name = name;
  t->path = join_path(folder, entry.at("file").as_string());
  size_t count = 1;
  for (const auto& d : entry.at("shape").as_array()) {
    t->shape.push_back(d.as_int());
    count *= size_t(d.as_int());
  }
  const std::string dtype = entry.at("dtype").as_string();
  if (dtype != "float32" && dtype != "uint8")
    throw bundle_error(t->path + ": table '" + name + "' is " + dtype + ", the onnx backend reads float32 and uint8 tables",
                       FIX);
  t->u8 = dtype == "uint8";
  t->bytes = count * (t->u8 ? 1 : sizeof(float));
  const int fd = ::open(t->path.c_str(), O_RDONLY);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0 || size_t(st.st_size) != t->bytes) {
    if (fd >= 0) ::close(fd);
    throw bundle_error(t->path + ": table '" + name + "' is missing or not " + std::to_string(t->bytes) + " bytes",
                       FIX);
  }
  void* p = ::mmap(nullptr, t->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw backend_error(t->path + ": cannot memory-map the table", "check free memory / ulimit -v");
  t->data = p;
  return t;
}

// ---- sessions --------------------------------------------------------------------------------------------
struct Runtime {  // the Env and the tables outlive both sessions
  std::unique_ptr<Ort::Env> env;
  Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::map<std::string, std::unique_ptr<Table>> tables;
  std::vector<Ort::Value> initializers;  // the tables given to a session as initializers: must outlive it
};

Ort::Value table_tensor(const Runtime& rt, const Table& t) {  // onnxruntime never writes an input or initializer
  if (t.u8)
    return Ort::Value::CreateTensor(rt.cpu, const_cast<void*>(t.data), t.bytes, t.shape.data(), t.shape.size(),
                                    ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8);
  return ort::tensor(rt.cpu, static_cast<float*>(const_cast<void*>(t.data)), t.shape);
}

// runtimes/ort.py make_session: sequential, all graph optimisations, errors-only logging, spinning as asked.
Ort::Session make_session(Runtime& rt, const std::string& path, int threads, bool spin,
                          const std::vector<std::string>& initializers) {
  Ort::SessionOptions so;
  so.SetIntraOpNumThreads(threads);  // 0: onnxruntime's default (one per physical core)
  so.SetInterOpNumThreads(1);
  so.SetExecutionMode(ORT_SEQUENTIAL);
  so.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
  so.SetLogSeverityLevel(3);
  so.AddConfigEntry("session.intra_op.allow_spinning", spin ? "1" : "0");
  if (!initializers.empty()) {  // the bundle's one copy of each table instead of the graph file's external data
    std::vector<Ort::Value> values;
    for (const auto& name : initializers) values.push_back(table_tensor(rt, *rt.tables.at(name)));
    so.AddExternalInitializers(initializers, values);  // the values reference the mapped tables, no copy
    for (auto& v : values) rt.initializers.push_back(std::move(v));
  }
  return ort::open_session(*rt.env, path, so,
                           "re-export the bundle with this edge-spec / onnxruntime, or update onnxruntime");
}

// runtimes/ort.py check_graph_io: the loaded graph's inputs and outputs (names, order, element types, ranks, fixed
// dims) are the ones the manifest records, so a graph swapped after export fails here, naming the file.
void check_graph_io(Ort::Session& session, const GraphIO& io, const std::string& path) {
  const ort::SessionIO got = ort::session_io(session);
  for (int pass = 0; pass < 2; ++pass) {
    const auto& want = pass == 0 ? io.inputs : io.outputs;
    const auto& names = pass == 0 ? got.input_names : got.output_names;
    const std::string role = pass == 0 ? "input" : "output";
    if (names != io_names(want)) {
      std::string have, expected;
      for (const auto& s : names) have += (have.empty() ? "" : ", ") + s;
      for (const auto& w : want) expected += (expected.empty() ? "" : ", ") + w.name;
      throw bundle_error(path + ": graph " + role + "s [" + have + "] differ from the manifest's [" + expected + "]",
                         "re-export the bundle (the graph file does not belong to this manifest)");
    }
    for (const TensorSpec& w : want) {
      const ort::TensorInfo& info = (pass == 0 ? got.inputs : got.outputs).at(w.name);  // symbolic dims: -1
      bool ok = ort::type_name(info.type) == w.dtype && info.shape.size() == w.shape.size();
      for (size_t j = 0; ok && j < info.shape.size(); ++j)
        if (w.shape[j].find_first_not_of("0123456789") == std::string::npos) ok = info.shape[j] == std::stoll(w.shape[j]);
      if (!ok)
        throw bundle_error(path + ": graph " + role + " " + w.name + " differs from the manifest's " + w.describe(),
                           FIX);
    }
  }
}

// ---- the target --------------------------------------------------------------------------------------------
class OrtBackend : public Backend {
 public:
  OrtBackend(std::shared_ptr<Runtime> rt, Ort::Session session, std::string path, const Manifest& m, std::string identity)
      : rt_(std::move(rt)), session_(std::move(session)), path_(std::move(path)), layout_(m.layout),
        vocab_(m.vocab_size), hidden_(m.hidden_size), identity_(std::move(identity)),
        shared_(m.binding == BINDING_SHARED), caches(m.layout, ORT_BUCKET, shared_ ? SHARED_SPARE_SLOTS : 0),
        in_names_(io_names(m.graphs.at("target").io.inputs)), out_names_(io_names(m.graphs.at("target").io.outputs)),
        logit_rows_(has_logit_rows(m.graphs.at("target").io)), aux_width(aux_size(m.graphs.at("target").io)) {
    k_new_.resize(layout_.caches.size());
    v_new_.resize(layout_.caches.size());
  }

  const KVLayout& layout() const override { return layout_; }
  int vocab_size() const override { return vocab_; }
  int hidden_size() const override { return hidden_; }
  std::string identity() const override { return identity_; }
  int bucket_size() const override { return ORT_BUCKET; }

  StepOutput forward(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const Masks& masks,
                     int64_t n_cached, bool last_only) override {
    StepOutput result;
    forward_into(ids, positions, masks, n_cached, last_only, result);
    return result;
  }

  // The graph writes logits and hidden straight into `result`'s buffers (resized in place: no allocation when T
  // repeats): every row, or with last_only over T > 1 (prefill chunks) the last row alone where the graph takes
  // LOGIT_ROWS (it then runs the head on that row only). Older graphs (no LOGIT_ROWS) compute every row of a
  // prefill chunk into the backend's own buffers, and the last row is copied.
  void forward_into(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const Masks& masks,
                    int64_t n_cached, bool last_only, StepOutput& result) override {
    const int t = int(ids.size());
    caches.prepare(n_cached, t);
    ids_ = ids;              // input_ids [1, T]
    positions_ = positions;  // position_ids [1, T]
    const bool last = last_only && t > 1 && logit_rows_;  // the graph returns the last row only
    const bool direct = !last_only || t == 1 || last;
    const int r = last ? 1 : t;  // rows the graph returns
    std::vector<float>& logits = direct ? result.logits : logits_;
    std::vector<float>& hiddens = direct ? result.hidden : hiddens_;
    logits.resize(size_t(r) * vocab_);
    hiddens.resize(size_t(r) * hidden_);
    std::map<std::string, Ort::Value> in, out;
    in.emplace(INPUT_IDS, tensor(rt_->cpu, ids_.data(), {1, t}));
    in.emplace(POSITION_IDS, tensor(rt_->cpu, positions_.data(), {1, t}));
    for (const auto& kind : layout_.kinds()) {  // mask.<kind> [T, S + T] -> the bound [1, 1, T, b + T]
      const Mask& m = masks.at(kind);
      const int s = layout_.slots(kind), b = caches.bucket(kind);
      std::vector<float>& dst = masks_[kind];
      dst.resize(size_t(t) * (b + t));
      const int seen = std::min(b, s);  // a `shared` bucket may bind a spare slot past the layer's own (masked)
      for (int r = 0; r < t; ++r) {
        const float* row = m.data.data() + size_t(r) * m.cols;
        float* out_row = dst.data() + size_t(r) * (b + t);
        std::memcpy(out_row, row, sizeof(float) * size_t(seen));
        std::fill(out_row + seen, out_row + b, NEG_INF);
        std::memcpy(out_row + b, row + s, sizeof(float) * size_t(t));
      }
      in.emplace(mask_name(kind), tensor(rt_->cpu, dst.data(), {1, 1, t, b + t}));
    }
    if (logit_rows_) {  // LOGIT_ROWS [R]: 0..T-1, or T-1 alone
      rows_.resize(size_t(r));
      for (int i = 0; i < r; ++i) rows_[size_t(i)] = last ? t - 1 : i;
      in.emplace(LOGIT_ROWS, tensor(rt_->cpu, rows_.data(), {r}));
    }
    out.emplace(LOGITS, tensor(rt_->cpu, logits.data(), {1, r, vocab_}));    // [1, R, V]
    out.emplace(HIDDEN, tensor(rt_->cpu, hiddens.data(), {1, r, hidden_}));  // [1, R, H]
    if (aux_width) {  // an eagle3 bundle's target: AUX_HIDDEN [1, T, n * H], every row (LOGIT_ROWS or not)
      aux_.resize(size_t(t) * size_t(aux_width));
      out.emplace(AUX_HIDDEN, tensor(rt_->cpu, aux_.data(), {1, t, int64_t(aux_width)}));
    }
    for (size_t i = 0; i < layout_.caches.size(); ++i) {
      const CacheSpec& c = layout_.caches[i];
      const int64_t h = c.num_kv_heads, b = caches.bucket(c.kind), d = c.head_dim;
      const std::string layer = std::to_string(c.layer);
      in.emplace(k_cache_name(layer), tensor(rt_->cpu, caches.k(i), {1, h, b, d}));  // [1, H_kv, b, D]
      in.emplace(v_cache_name(layer), tensor(rt_->cpu, caches.v(i), {1, h, b, d}));
      if (shared_) {  // the caches out are the caches in: the graph writes its rows in place
        out.emplace(k_present_name(layer), tensor(rt_->cpu, caches.k(i), {1, h, b, d}));
        out.emplace(v_present_name(layer), tensor(rt_->cpu, caches.v(i), {1, h, b, d}));
        continue;
      }
      k_new_[i].resize(size_t(h * t * d));
      v_new_[i].resize(size_t(h * t * d));
      out.emplace(k_new_name(layer), tensor(rt_->cpu, k_new_[i].data(), {1, h, t, d}));  // [1, H_kv, T, D]
      out.emplace(v_new_name(layer), tensor(rt_->cpu, v_new_[i].data(), {1, h, t, d}));
    }
    const double start = now_s();
    ort::run(session_, in_names_, in, out_names_, out, path_, RUN_FIX);
    kernel_s += now_s() - start;
    pending_ = t;
    if (aux_record) aux_record->record(ids_.data(), positions_.data(), aux_.data(), t);
    result.rows = direct ? r : 1;
    if (!direct) {
      result.logits.assign(logits_.end() - vocab_, logits_.end());
      result.hidden.assign(hiddens_.end() - hidden_, hiddens_.end());
    }
  }

  void commit(const CommitPlan& plan) override {  // the `io` binding: the runner writes the accepted rows
    if (!pending_) throw kv_state_error("commit without a forward", "call forward before commit");
    caches.commit(plan, k_new_, v_new_, pending_, shared_);
    pending_ = 0;
  }

  void reset() override { pending_ = 0; }  // stale rows stay in the buffers; KVState's masks hide them

  std::shared_ptr<Runtime> rt_;
  Ort::Session session_;
  std::string path_;
  KVLayout layout_;
  int vocab_, hidden_;
  std::string identity_;
  bool shared_;  // the `shared` binding: caches bound as inputs and outputs, written by the graph
  IoCaches caches;

 private:
  std::vector<std::string> in_names_, out_names_;
  bool logit_rows_;  // the graph takes LOGIT_ROWS

 public:
  // An eagle3 bundle's target also returns AUX_HIDDEN [1, T, aux_width] (0: it does not); after each pass its rows go
  // to `aux_record` (set by the eagle3 drafter, which owns it), with the pass's ids and positions.
  const int aux_width;
  AuxRecord* aux_record = nullptr;

 private:
  std::vector<float> aux_;  // AUX_HIDDEN of the last pass [T, aux_width]
  std::vector<int64_t> ids_, positions_, rows_;
  std::map<std::string, std::vector<float>> masks_;
  std::vector<float> logits_, hiddens_;
  std::vector<std::vector<float>> k_new_, v_new_;  // per cached layer [1, H_kv, T, D]
  int pending_ = 0;                                 // T of the last forward (its new rows sit in k_new_ / v_new_)
};

// ---- the drafter: one draft step over the target's caches (its kv_sharing source layers) ---------------------
class OrtDrafter : public DrafterBackend {
 public:
  OrtDrafter(std::shared_ptr<Runtime> rt, Ort::Session session, std::string path, OrtBackend& target, const Manifest& m)
      : rt_(std::move(rt)), session_(std::move(session)), path_(std::move(path)), target_(target),
        candidates_(m.drafter->candidates_per_step), hidden_size_(m.hidden_size),
        in_names_(io_names(m.graphs.at("drafter").io.inputs)), out_names_(io_names(m.graphs.at("drafter").io.outputs)) {
    for (const auto& share : m.drafter->kv_sharing)  // std::map: sorted by kind (kv.source_caches)
      for (size_t i = 0; i < m.layout.caches.size(); ++i)
        if (m.layout.caches[i].layer == share.second) sources_.emplace_back(share.first, i);
    for (const auto& name : in_names_)
      if (rt_->tables.count(name)) tables_.push_back(name);
    out_ids_.resize(size_t(candidates_));
    out_logits_.resize(size_t(candidates_));
    out_hidden_.resize(size_t(hidden_size_));
  }

  // The burst starts at the bonus token's position; masks: kind -> [1, S_kind], bound as the target's bucket.
  void begin(int64_t position, const Masks& masks, int64_t) override {
    position_ = position;
    for (const auto& src : sources_) {
      const int b = target_.caches.bucket(src.first);
      const Mask& m = masks.at(src.first);
      const int seen = std::min<int>(b, int(m.data.size()));  // a spare slot past the layer's own stays masked
      masks_[src.first].assign(m.data.begin(), m.data.begin() + seen);  // [1, 1, 1, b]
      masks_[src.first].resize(size_t(b), NEG_INF);
    }
  }

  DraftStep step(int64_t token, const std::vector<float>& hidden) override {
    token_ = token;
    hidden_ = hidden;
    pos_ = position_;
    std::map<std::string, Ort::Value> in, out;
    in.emplace(INPUT_IDS, tensor(rt_->cpu, &token_, {1, 1}));                         // [1, 1]
    in.emplace(HIDDEN, tensor(rt_->cpu, hidden_.data(), {1, 1, int64_t(hidden_size_)}));  // [1, 1, H]
    in.emplace(POSITION_IDS, tensor(rt_->cpu, &pos_, {1, 1}));                         // [1, 1]
    for (const auto& src : sources_) {
      const CacheSpec& c = target_.layout_.caches[src.second];
      const int64_t h = c.num_kv_heads, b = target_.caches.bucket(c.kind), d = c.head_dim;
      const std::string layer = std::to_string(c.layer);
      in.emplace(mask_name(src.first), tensor(rt_->cpu, masks_[src.first].data(), {1, 1, 1, b}));
      in.emplace(k_cache_name(layer), tensor(rt_->cpu, target_.caches.k(src.second), {1, h, b, d}));  // [1, H_kv, b, D]
      in.emplace(v_cache_name(layer), tensor(rt_->cpu, target_.caches.v(src.second), {1, h, b, d}));
    }
    for (const auto& name : tables_) in.emplace(name, table_tensor(*rt_, *rt_->tables.at(name)));  // [V, H]
    out.emplace(DRAFT_TOKEN_IDS, tensor(rt_->cpu, out_ids_.data(), {int64_t(candidates_)}));  // [N]
    out.emplace(DRAFT_LOGITS, tensor(rt_->cpu, out_logits_.data(), {int64_t(candidates_)}));  // [N]
    out.emplace(DRAFT_HIDDEN, tensor(rt_->cpu, out_hidden_.data(), {1, 1, int64_t(hidden_size_)}));
    const double start = now_s();
    ort::run(session_, in_names_, in, out_names_, out, path_, RUN_FIX);
    kernel_s += now_s() - start;
    return DraftStep{out_ids_, out_logits_, out_hidden_};
  }

 private:
  std::shared_ptr<Runtime> rt_;
  Ort::Session session_;
  std::string path_;
  OrtBackend& target_;
  int candidates_, hidden_size_;
  std::vector<std::string> in_names_, out_names_;
  std::vector<std::pair<std::string, size_t>> sources_;  // kind -> index into layout.caches
  std::vector<std::string> tables_;                      // the tables the graph takes as inputs
  std::map<std::string, std::vector<float>> masks_;
  int64_t position_ = 0, token_ = 0, pos_ = 0;
  std::vector<float> hidden_;
  std::vector<int64_t> out_ids_;
  std::vector<float> out_logits_, out_hidden_;
};

// ---- an EAGLE-3 drafter: the fc and step graphs over its own cache (runtimes/ort_eagle3.py OrtEagle3Drafter) -------
// The target records its aux states by position (AuxRecord); each step runs the rows Eagle3Rows says (eagle3.h: the
// burst's first step fuses the target rows not yet fused through the fc graph, later steps chain one row), binding
// the drafter's cache as its bucket (IoCaches over the manifest's draft layout, kind DRAFT_KIND, max_context + 1
// slots) and writing the step's new rows after the ones written this burst. `begin` rewinds the written count to the
// committed rows that still agree with the target's tokens, so the drafter's cache is committed and rewound with the
// target's.
KVLayout session_draft_layout(const KVLayout& manifest_layout, int max_context) {  // ort_eagle3.py draft_layout
  KVLayout draft = manifest_layout;
  for (auto& c : draft.caches) c.slots = max_context + 1;
  draft.max_context = max_context + 1;
  return draft;
}

class OrtEagle3Drafter : public DrafterBackend {
 public:
  OrtEagle3Drafter(std::shared_ptr<Runtime> rt, Ort::Session step, std::string step_path, Ort::Session fc,
                   std::string fc_path, OrtBackend& target, const Manifest& m)
      : rt_(std::move(rt)), step_(std::move(step)), fc_(std::move(fc)), step_path_(std::move(step_path)),
        fc_path_(std::move(fc_path)), target_(target), hidden_size_(m.hidden_size),
        vocab_(m.drafter->draft_vocab_size), draft_(session_draft_layout(*m.drafter->draft_kv, m.max_context())),
        record_(m.max_context(), target.aux_width), rows_(record_, draft_.max_context), caches_(draft_, ORT_BUCKET, 0),
        in_names_(io_names(m.graphs.at("drafter").io.inputs)), out_names_(io_names(m.graphs.at("drafter").io.outputs)),
        fc_in_(io_names(m.graphs.at(EAGLE3_FC_GRAPH).io.inputs)),
        fc_out_(io_names(m.graphs.at(EAGLE3_FC_GRAPH).io.outputs)) {
    if (!target.aux_width)
      throw bundle_error(target.path_ + ": the target graph has no " + std::string(AUX_HIDDEN) +
                             " output, which an eagle3 drafter reads",
                         "re-export the bundle with this edge-spec (edge-spec export --drafter EAGLE3_FOLDER)");
    target_.aux_record = &record_;
    for (const auto& name : in_names_)  // the shared embedding, when the step graph gathers the target's table
      if (rt_->tables.count(name)) tables_.push_back(name);
    out_ids_.resize(size_t(vocab_));
    out_logits_.resize(size_t(vocab_));
    out_hidden_.resize(size_t(hidden_size_));
    k_new_.resize(draft_.caches.size());
    v_new_.resize(draft_.caches.size());
  }
  ~OrtEagle3Drafter() override { target_.aux_record = nullptr; }

  // A burst after the target's committed positions [0, position); the target's masks are unused.
  void begin(int64_t position, const Masks&, int64_t) override { rows_.begin(position); }

  DraftStep step(int64_t token, const std::vector<float>& hidden) override {
    const Eagle3Rows::Rows rows = rows_.next(token);
    Eagle3Rows::check_room(rows, draft_.max_context);
    Eagle3Rows::drive(  // a first step: EAGLE3_FIRST_CHUNK rows at a time; a chained one: the previous hidden
        rows, EAGLE3_FIRST_CHUNK, [&](int64_t from, int n) { fuse(from, n); },
        [&] { x_.assign(hidden.begin(), hidden.end()); },
        [&](const int64_t* ids, int n, int64_t s) { run_rows(ids, n, s); });
    rows_.wrote(rows);
    return DraftStep{out_ids_, out_logits_, out_hidden_};
  }

 private:
  // x_ = fused_hidden [1, n, H] = fc(the target's aux rows [from, from + n)) [1, n, n_aux * H]
  void fuse(int64_t from, int n) {
    x_.resize(size_t(n) * size_t(hidden_size_));
    std::map<std::string, Ort::Value> in, out;
    in.emplace(AUX_HIDDEN, tensor(rt_->cpu, const_cast<float*>(record_.aux_rows(from)),
                                  {1, n, int64_t(record_.width)}));  // onnxruntime never writes an input
    out.emplace(FUSED_HIDDEN, tensor(rt_->cpu, x_.data(), {1, n, int64_t(hidden_size_)}));
    const double start = now_s();
    ort::run(fc_, fc_in_, in, fc_out_, out, fc_path_, RUN_FIX);
    kernel_s += now_s() - start;
  }

  // The step graph over t rows (tokens `ids`, hidden x_ [1, t, H]) after the s written ones; their new K/V rows go
  // into slots s..s + t - 1, the last row's outputs into out_ids_ / out_logits_ / out_hidden_.
  void run_rows(const int64_t* ids, int t, int64_t s) {
    const int64_t h = hidden_size_;
    caches_.prepare(s, t);  // a bucket b >= s + t slots, keeping rows [0, s)
    const int b = caches_.bucket(DRAFT_KIND);
    ids_.assign(ids, ids + t);  // input_ids [1, T]
    positions_.resize(size_t(t));
    for (int i = 0; i < t; ++i) positions_[size_t(i)] = s + 1 + i;  // position_ids [1, T]: s + 1..s + T
    mask_.assign(size_t(t) * size_t(b + t), NEG_INF);  // draft_mask [1, 1, T, b + T]
    for (int r = 0; r < t; ++r) {
      float* row = mask_.data() + size_t(r) * size_t(b + t);
      std::fill(row, row + s, 0.0f);           // every written row is visible
      std::fill(row + b, row + b + r + 1, 0.0f);  // causal over the new rows
    }
    std::map<std::string, Ort::Value> in, out;
    in.emplace(INPUT_IDS, tensor(rt_->cpu, ids_.data(), {1, t}));
    in.emplace(HIDDEN, tensor(rt_->cpu, x_.data(), {1, t, h}));
    in.emplace(POSITION_IDS, tensor(rt_->cpu, positions_.data(), {1, t}));
    in.emplace(DRAFT_MASK, tensor(rt_->cpu, mask_.data(), {1, 1, t, b + t}));
    for (const auto& name : tables_) in.emplace(name, table_tensor(*rt_, *rt_->tables.at(name)));  // [V, H] or codes
    out.emplace(DRAFT_TOKEN_IDS, tensor(rt_->cpu, out_ids_.data(), {int64_t(vocab_)}));     // [Vd] target ids
    out.emplace(DRAFT_LOGITS, tensor(rt_->cpu, out_logits_.data(), {int64_t(vocab_)}));    // [Vd]
    out.emplace(DRAFT_HIDDEN, tensor(rt_->cpu, out_hidden_.data(), {1, 1, h}));           // [1, 1, H]
    for (size_t i = 0; i < draft_.caches.size(); ++i) {
      const CacheSpec& c = draft_.caches[i];
      const int64_t heads = c.num_kv_heads, d = c.head_dim;
      in.emplace(draft_k_cache_name(c.layer), tensor(rt_->cpu, caches_.k(i), {1, heads, b, d}));  // [1, H_kv, b, D]
      in.emplace(draft_v_cache_name(c.layer), tensor(rt_->cpu, caches_.v(i), {1, heads, b, d}));
      k_new_[i].resize(size_t(heads * t * d));
      v_new_[i].resize(size_t(heads * t * d));
      out.emplace(draft_k_new_name(c.layer), tensor(rt_->cpu, k_new_[i].data(), {1, heads, t, d}));  // [1, H_kv, T, D]
      out.emplace(draft_v_new_name(c.layer), tensor(rt_->cpu, v_new_[i].data(), {1, heads, t, d}));
    }
    const double start = now_s();
    ort::run(step_, in_names_, in, out_names_, out, step_path_, RUN_FIX);
    kernel_s += now_s() - start;
    CommitPlan plan;  // the T new rows into slots s..s + T - 1 of the bound bucket (which holds them: prepare)
    auto& entry = plan[DRAFT_KIND];
    for (int i = 0; i < t; ++i) {
      entry.first.push_back(i);
      entry.second.push_back(s + i);
    }
    caches_.commit(plan, k_new_, v_new_, t, /*in_place=*/false);
  }

  std::shared_ptr<Runtime> rt_;
  Ort::Session step_, fc_;
  std::string step_path_, fc_path_;
  OrtBackend& target_;
  int hidden_size_, vocab_;
  KVLayout draft_;  // the drafter's own cache layout for this session (max_context + 1 slots a layer)
  AuxRecord record_;
  Eagle3Rows rows_;
  IoCaches caches_;
  std::vector<std::string> in_names_, out_names_, fc_in_, fc_out_;
  std::vector<std::string> tables_;  // the shared tables the step graph takes as inputs (none: it has its own)
  std::vector<int64_t> ids_, positions_;
  std::vector<float> x_, mask_;
  std::vector<int64_t> out_ids_;
  std::vector<float> out_logits_, out_hidden_;
  std::vector<std::vector<float>> k_new_, v_new_;  // per drafter layer [1, H_kv, T, D]
};

std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_sessions(const std::string& folder,
                                                                                   const Manifest& m, int threads) {
  auto rt = std::make_shared<Runtime>();
  rt->env = std::make_unique<Ort::Env>(ORT_LOGGING_LEVEL_ERROR, "edge-spec");
  for (const auto& t : m.tables) rt->tables[t.first] = map_table(folder, m, t.first);
  // the tables the target graph reads as initializers (kv.TARGET_TABLES): every table but the drafter's output_table
  std::vector<std::string> target_tables;
  for (const auto& t : rt->tables)
    if (t.first != OUTPUT_TABLE) target_tables.push_back(t.first);
  if (!rt->tables.count(EMBED_TABLE) && !table_bits(m))
    throw bundle_error(join_path(folder, MANIFEST_FILE) + ": the onnx bundle has no embed_table", FIX);
  const GraphEntry& entry = m.graphs.at("target");
  const std::string path = join_path(folder, entry.file);
  // the target spins between steps (the Python runtime's default), the drafter never does (runtimes/ort.py)
  Ort::Session target = make_session(*rt, path, threads, /*spin=*/true, target_tables);
  check_graph_io(target, entry.io, path);
  const std::string identity = "onnxruntime " + Ort::GetVersionString() + " (native), CPUExecutionProvider, " +
                               (threads ? std::to_string(threads) : std::string("default")) + " intra-op threads";
  auto backend = std::make_unique<OrtBackend>(rt, std::move(target), path, m, identity);
  std::unique_ptr<DrafterBackend> drafter;
  if (m.drafter && m.drafter->is_eagle3()) {  // its step and fc graphs, its own cache (never spinning either)
    std::map<std::string, Ort::Session> sessions;
    std::map<std::string, std::string> paths;
    for (const std::string& name : {std::string("drafter"), std::string(EAGLE3_FC_GRAPH)}) {
      const GraphEntry& g = m.graphs.at(name);
      paths[name] = join_path(folder, g.file);
      sessions.emplace(name, make_session(*rt, paths[name], threads, /*spin=*/false, {}));
      check_graph_io(sessions.at(name), g.io, paths[name]);
    }
    drafter = std::make_unique<OrtEagle3Drafter>(rt, std::move(sessions.at("drafter")), paths["drafter"],
                                                 std::move(sessions.at(EAGLE3_FC_GRAPH)), paths[EAGLE3_FC_GRAPH],
                                                 *backend, m);
  } else if (m.drafter) {
    const GraphEntry& d = m.graphs.at("drafter");
    const std::string dpath = join_path(folder, d.file);
    Ort::Session session = make_session(*rt, dpath, threads, /*spin=*/false, {});
    check_graph_io(session, d.io, dpath);
    drafter = std::make_unique<OrtDrafter>(rt, std::move(session), dpath, *backend, m);
  }
  return {std::move(backend), std::move(drafter)};
}

}  // namespace

std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_ort(const std::string& folder,
                                                                              const Manifest& m, int threads) {
  if (threads < 0) throw config_error("threads must be >= 0, got " + std::to_string(threads), "use --threads 2");
  ort::check_api();
  if (m.binding != BINDING_IO && m.binding != BINDING_SHARED)
    throw bundle_error(join_path(folder, MANIFEST_FILE) + ": the onnx backend runs the `io` and `shared` bindings, this bundle's is '" +
                           m.binding + "'",
                       FIX);
  try {
    return open_sessions(folder, m, threads);
  } catch (const Ort::Exception& err) {  // anything make_session / check_graph_io did not name
    throw backend_error("onnxruntime " + Ort::GetVersionString() + ": " + ort::first_line(err.what()),
                        "check the bundle with `edge-spec check --bundle " + folder + "`");
  }
}

}  // namespace es

#endif  // ES_HAVE_ORT
