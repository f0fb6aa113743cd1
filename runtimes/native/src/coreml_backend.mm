// coreml_backend.mm - see coreml_backend.h. Read top to bottom: the features each function takes (from the manifest:
// its graph IO at the function's fixed length), the target backend (runtimes/fixed.py FixedBackend: padded passes,
// the `io` caches held here), the drafter (FixedDrafter; an eagle3 drafter: fixed_eagle3.h over its step and fc
// functions, as runtimes/coreml.py runs runtimes/fixed_eagle3.py), open_coreml (runtimes/coreml.py open_bundle). The
// padding, masks and commit bookkeeping are fixed.cpp's; the MLModel calls coreml_model.mm's.
//
// Objective-C++ with ARC, compiled only with ES_HAVE_COREML (CMakeLists.txt on APPLE; the iOS app's project.yml).
#ifdef ES_HAVE_COREML

#if !__has_feature(objc_arc)
#error "coreml_backend.mm needs ARC: compile it with -fobjc-arc (CMakeLists.txt does)"
#endif

#include "coreml_backend.h"

#include <exception>

#include "contract_names.h"
#include "coreml_model.h"
#include "fixed.h"
#include "fixed_eagle3.h"

namespace es {

using namespace contract;  // the graph IO names and formats (contract_names.h, generated)

namespace {

using coreml::Feature;
using coreml::Feeds;
using coreml::Function;
using Dims = std::vector<int64_t>;

const char* const LENGTH_FIX = "re-export with --max-pass";  // runtimes/coreml.py: FixedBackend(fix=...)

// Runs `body` inside an autorelease pool, so the Core ML objects of one call are freed when it returns (the runner
// has no pool of its own); an exception leaves the pool first, then goes on.
template <typename F>
auto pooled(F&& body) -> decltype(body()) {
  std::exception_ptr error;
  decltype(body()) result{};
  @autoreleasepool {
    try {
      result = body();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return result;
}

bool is_mask(const std::string& name) {
  const std::string prefix = mask_name("");
  return name.compare(0, prefix.size(), prefix) == 0;
}

// The target function at length t: the manifest's inputs and outputs at their fixed dims; `state`: masks in the slot
// form [1, 1, T, S_f] and the write slots [T] after them (exporters/coreml.py target_features).
std::pair<std::vector<Feature>, std::vector<Feature>> target_features(const Manifest& m, const FixedShapes& s, int t) {
  const GraphIO& io = m.graphs.at("target").io;
  const bool state = m.binding == BINDING_STATE;
  std::vector<Feature> in, out;
  for (const auto& spec : io.inputs)
    in.push_back(coreml::feature(spec.name, state && is_mask(spec.name)
                                                ? Dims{1, 1, t, s.slots.at(spec.name.substr(5))}
                                                : fixed_dims(spec, t, s.slots)));
  if (state)
    for (const auto& kind : m.layout.kinds()) in.push_back(coreml::feature(write_slots_name(kind), {t}));
  for (const auto& spec : io.outputs) out.push_back(coreml::feature(spec.name, fixed_dims(spec, t, s.slots)));
  return {in, out};
}

// The drafter function (graph entry `graph`: "drafter", or an eagle3 drafter's EAGLE3_FC_GRAPH) at length t.
std::pair<std::vector<Feature>, std::vector<Feature>> drafter_features(const Manifest& m, const std::string& graph,
                                                                       int t, const std::map<std::string, int>& slots) {
  const GraphIO& io = m.graphs.at(graph).io;
  std::vector<Feature> in, out;
  for (const auto& spec : io.inputs) in.push_back(coreml::feature(spec.name, fixed_dims(spec, t, slots)));
  for (const auto& spec : io.outputs) out.push_back(coreml::feature(spec.name, fixed_dims(spec, t, slots)));
  return {in, out};
}

// `state` binding: the states every function declares (exporters/coreml.py state_names) -> [1, H_kv, S_f, D].
std::map<std::string, Dims> state_shapes(const KVLayout& layout, const FixedShapes& s) {
  std::map<std::string, Dims> out;
  for (const auto& c : layout.caches)
    for (const std::string& name : {k_cache_name(c.layer), v_cache_name(c.layer)})
      out[feature_name(name)] = {1, c.num_kv_heads, s.slots.at(c.kind), c.head_dim};
  return out;
}

struct API_AVAILABLE(macos(15.0), ios(18.0)) Program {
  FixedShapes shapes;
  std::map<int, Function> targets;  // pass length -> its function
  Function drafter;                 // model nil: the bundle has none (or an eagle3 one)
  std::map<int, Function> eagle3_steps, eagle3_fcs;  // an eagle3 drafter's functions by length
  MLState* state = nil;             // `state` binding: one state for every function
};

// ---- the target ----------------------------------------------------------------------------------------------
class API_AVAILABLE(macos(15.0), ios(18.0)) CoreMLBackend : public Backend {
 public:
  CoreMLBackend(std::shared_ptr<Program> program, const Manifest& m, std::string identity)
      : program_(std::move(program)), layout_(m.layout), vocab_(m.vocab_size), hidden_(m.hidden_size),
        identity_(std::move(identity)), state_(m.binding == BINDING_STATE), caches(m.layout, program_->shapes.slots),
        aux_width(aux_size(m.graphs.at("target").io)), new_k_(m.layout.caches.size()), new_v_(m.layout.caches.size()) {}

  const KVLayout& layout() const override { return layout_; }
  int vocab_size() const override { return vocab_; }
  int hidden_size() const override { return hidden_; }
  std::string identity() const override { return identity_; }

  StepOutput forward(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const Masks& masks,
                     int64_t, bool last_only) override {
    pass_ = plan_pass(program_->shapes, layout_, ids, positions, masks, NEG_INF, LENGTH_FIX);
    const int t = pass_.t, n = pass_.n, first = last_only ? t - 1 : 0;
    const Function& f = program_->targets.at(n);
    Feeds feeds = {{INPUT_IDS, {pass_.ids.data(), DType::I32, {1, n}}},               // [1, T] int32
                   {POSITION_IDS, {pass_.positions.data(), DType::I32, {1, n}}}};     // [1, T] int32
    for (const auto& kind : layout_.kinds()) {
      const int64_t s_f = program_->shapes.slots.at(kind);
      const Dims dims = state_ ? Dims{1, 1, n, s_f} : Dims{1, 1, n, s_f + n};  // [1, 1, T, S_f] | [1, 1, T, S_f + T]
      feeds[mask_name(kind)] = {pass_.masks.at(kind).data(), DType::F32, dims};
      if (state_) feeds[write_slots_name(kind)] = {pass_.write_slots.at(kind).data(), DType::I32, {n}};  // [T]
    }
    for (size_t i = 0; !state_ && i < layout_.caches.size(); ++i) {  // the runner's caches [1, H_kv, S_f, D], no copy
      const std::string layer = std::to_string(layout_.caches[i].layer);
      feeds[k_cache_name(layer)] = {caches.k(i), DType::F32, caches.shape(i)};
      feeds[v_cache_name(layer)] = {caches.v(i), DType::F32, caches.shape(i)};
    }
    StepOutput result = pooled([&] {
      id<MLFeatureProvider> out = f.run(feeds, program_->state, &kernel_s);
      StepOutput r;
      r.rows = t - first;
      r.logits.resize(size_t(r.rows) * size_t(vocab_));
      r.hidden.resize(size_t(r.rows) * size_t(hidden_));
      f.read(out, LOGITS, {{0, 1}, {first, t}, {0, vocab_}}, r.logits.data());   // [1, T, V] -> [rows, V]
      f.read(out, HIDDEN, {{0, 1}, {first, t}, {0, hidden_}}, r.hidden.data());  // [1, T, H] -> [rows, H]
      if (aux_width) {  // an eagle3 bundle's AUX_HIDDEN [1, T, n_aux * H]: every real row, for the drafter's record
        aux_.resize(size_t(t) * size_t(aux_width));
        f.read(out, AUX_HIDDEN, {{0, 1}, {0, t}, {0, aux_width}}, aux_.data());
      }
      for (size_t i = 0; !state_ && i < layout_.caches.size(); ++i) {  // [1, H_kv, T, D] -> the real rows [H_kv, t, D]
        const CacheSpec& c = layout_.caches[i];
        const std::string layer = std::to_string(c.layer);
        const Box rows = {{0, 1}, {0, c.num_kv_heads}, {0, t}, {0, c.head_dim}};
        new_k_[i].resize(size_t(c.num_kv_heads) * size_t(t) * size_t(c.head_dim));
        new_v_[i].resize(new_k_[i].size());
        f.read(out, k_new_name(layer), rows, new_k_[i].data());
        f.read(out, v_new_name(layer), rows, new_v_[i].data());
      }
      return r;
    });
    pending_ = t;
    if (aux_width && aux_record) aux_record->record(ids.data(), positions.data(), aux_.data(), t);
    return result;
  }

  void commit(const CommitPlan& plan) override {
    if (!pending_) throw kv_state_error("commit without a forward", "call forward before commit");
    if (!state_) caches.commit(plan, new_k_, new_v_, pending_);  // `state`: the function wrote every row already
    pending_ = 0;
  }

  void reset() override { pending_ = 0; }  // stale rows stay in the caches / the state; KVState's masks hide them

  std::shared_ptr<Program> program_;
  KVLayout layout_;
  int vocab_, hidden_;
  std::string identity_;
  bool state_;
  FixedCaches caches;  // `io` binding: [1, H_kv, S_f, D] float32 per cached layer (unused for `state`)
  // An eagle3 bundle's target functions also return AUX_HIDDEN [1, T, aux_width] (0: they do not); after each pass
  // its rows go to `aux_record` (set by the eagle3 drafter, which owns it: fixed_eagle3.h).
  const int aux_width;
  AuxRecord* aux_record = nullptr;

 private:
  std::vector<float> aux_;                         // the last forward's aux rows [t, aux_width]
  FixedPass pass_;                                 // the feeds of the last forward (they back its input arrays)
  std::vector<std::vector<float>> new_k_, new_v_;  // per cached layer, its real new rows [H_kv, t, D]
  int pending_ = 0;                                // t of the last forward
};

// ---- the drafter: one step over the target's caches (or the shared state) --------------------------------------
class API_AVAILABLE(macos(15.0), ios(18.0)) CoreMLDrafter : public DrafterBackend {
 public:
  CoreMLDrafter(std::shared_ptr<Program> program, CoreMLBackend& target, const Manifest& m)
      : program_(std::move(program)), target_(target), candidates_(m.drafter->candidates_per_step),
        hidden_size_(m.hidden_size) {
    for (const auto& share : m.drafter->kv_sharing)  // std::map: sorted by kind (kv.source_caches)
      for (size_t i = 0; i < m.layout.caches.size(); ++i)
        if (m.layout.caches[i].layer == share.second) sources_.emplace_back(share.first, i);
  }

  // The burst starts at the bonus token's position; masks: kind -> [1, S] -> [1, 1, 1, S_f] (headroom masked).
  void begin(int64_t position, const Masks& masks, int64_t) override {
    position_ = int32_t(position);
    for (const auto& src : sources_)
      masks_[src.first] = drafter_mask(masks.at(src.first), target_.layout_.slots(src.first),
                                       program_->shapes.slots.at(src.first), NEG_INF);
  }

  DraftStep step(int64_t token, const std::vector<float>& hidden) override {
    token_ = int32_t(token);
    hidden_ = hidden;
    Feeds feeds = {{INPUT_IDS, {&token_, DType::I32, {1, 1}}},                                  // [1, 1] int32
                   {HIDDEN, {hidden_.data(), DType::F32, {1, 1, int64_t(hidden_.size())}}},     // [1, 1, H]
                   {POSITION_IDS, {&position_, DType::I32, {1, 1}}}};                          // [1, 1] int32
    for (const auto& src : sources_) {
      const int64_t s_f = program_->shapes.slots.at(src.first);
      feeds[mask_name(src.first)] = {masks_.at(src.first).data(), DType::F32, {1, 1, 1, s_f}};   // [1, 1, 1, S_f]
      if (target_.state_) continue;  // the state holds the caches
      const std::string layer = std::to_string(target_.layout_.caches[src.second].layer);
      const Dims shape = target_.caches.shape(src.second);  // the target's committed caches, read in place
      feeds[k_cache_name(layer)] = {target_.caches.k(src.second), DType::F32, shape};
      feeds[v_cache_name(layer)] = {target_.caches.v(src.second), DType::F32, shape};
    }
    const Function& f = program_->drafter;
    return pooled([&] {
      id<MLFeatureProvider> out = f.run(feeds, program_->state, &kernel_s);
      DraftStep d;
      d.token_ids.resize(size_t(candidates_));
      d.logits.resize(size_t(candidates_));
      d.hidden.resize(size_t(hidden_size_));
      f.read(out, DRAFT_TOKEN_IDS, {{0, candidates_}}, d.token_ids.data());  // [N] int32 -> int64
      f.read(out, DRAFT_LOGITS, {{0, candidates_}}, d.logits.data());        // [N]
      f.read(out, DRAFT_HIDDEN, {{0, 1}, {0, 1}, {0, hidden_size_}}, d.hidden.data());  // [1, 1, H]
      return d;
    });
  }

 private:
  std::shared_ptr<Program> program_;
  CoreMLBackend& target_;
  int64_t candidates_, hidden_size_;
  std::vector<std::pair<std::string, size_t>> sources_;  // kind -> index into layout.caches
  std::map<std::string, std::vector<float>> masks_;      // kind -> [S_f]
  int32_t position_ = 0, token_ = 0;
  std::vector<float> hidden_;
};

// ---- an eagle3 drafter: its step and fc functions run by fixed_eagle3.h (runtimes/coreml.py + fixed_eagle3.py) -----
API_AVAILABLE(macos(15.0), ios(18.0))
std::unique_ptr<DrafterBackend> eagle3_drafter(std::shared_ptr<Program> program, CoreMLBackend& target,
                                               const Manifest& m) {
  const KVLayout& draft = *m.drafter->draft_kv;
  const int64_t h = m.hidden_size, vd = m.drafter->draft_vocab_size, s = draft.max_context, w = target.aux_width;
  FixedEagle3Graphs graphs;
  for (const auto& e : program->eagle3_steps) graphs.lengths.push_back(e.first);
  graphs.step = [program, draft, h, vd, s](Eagle3StepCall& c) {
    const Function& f = program->eagle3_steps.at(c.n);
    const int64_t n = c.n;
    Feeds feeds = {{INPUT_IDS, {c.ids, DType::I32, {1, n}}},              // [1, T] int32
                   {HIDDEN, {c.hidden, DType::F32, {1, n, h}}},          // [1, T, H]
                   {POSITION_IDS, {c.positions, DType::I32, {1, n}}},    // [1, T] int32
                   {DRAFT_MASK, {c.mask, DType::F32, {1, 1, n, s + n}}}};  // [1, 1, T, S + T]
    for (size_t i = 0; i < draft.caches.size(); ++i) {  // its own caches [1, H_kv, S, D], held by the drafter
      const CacheSpec& l = draft.caches[i];
      const Dims shape = {1, l.num_kv_heads, s, l.head_dim};
      feeds[draft_k_cache_name(l.layer)] = {(*c.k)[i].data(), DType::F32, shape};
      feeds[draft_v_cache_name(l.layer)] = {(*c.v)[i].data(), DType::F32, shape};
    }
    pooled([&] {
      double unused = 0.0;  // FixedEagle3Drafter times the call
      id<MLFeatureProvider> out = f.run(feeds, nil, &unused);
      std::vector<int64_t> ids(static_cast<size_t>(vd));
      f.read(out, DRAFT_TOKEN_IDS, {{0, vd}}, ids.data());  // [Vd] int32 -> int64 (target ids)
      for (int64_t j = 0; j < vd; ++j) c.token_ids[j] = int32_t(ids[size_t(j)]);
      f.read(out, DRAFT_LOGITS, {{0, vd}}, c.logits);                      // [Vd]
      f.read(out, DRAFT_HIDDEN, {{0, 1}, {0, 1}, {0, h}}, c.out_hidden);  // [1, 1, H]
      for (size_t i = 0; i < draft.caches.size(); ++i) {  // [1, H_kv, T, D]
        const CacheSpec& l = draft.caches[i];
        const Box rows = {{0, 1}, {0, l.num_kv_heads}, {0, n}, {0, l.head_dim}};
        f.read(out, draft_k_new_name(l.layer), rows, (*c.k_new)[i].data());
        f.read(out, draft_v_new_name(l.layer), rows, (*c.v_new)[i].data());
      }
      return 0;
    });
  };
  graphs.fc = [program, h, w](int n, const float* aux, float* fused) {
    const Function& f = program->eagle3_fcs.at(n);
    Feeds feeds = {{AUX_HIDDEN, {aux, DType::F32, {1, n, w}}}};  // [1, T, n_aux * H] (the stream as the target returns it)
    pooled([&] {
      double unused = 0.0;
      id<MLFeatureProvider> out = f.run(feeds, nil, &unused);
      f.read(out, FUSED_HIDDEN, {{0, 1}, {0, n}, {0, h}}, fused);  // [1, T, H]
      return 0;
    });
  };
  return std::make_unique<FixedEagle3Drafter>(std::move(graphs), draft, m.max_context(), int(w), int(h), int(vd),
                                              NEG_INF, &target.aux_record);
}

// ---- open ------------------------------------------------------------------------------------------------------
void check_state_lists(const Manifest& m, const FixedShapes& s, const std::string& where) {
  std::string want, have;
  for (const auto& f : target_features(m, s, 1).first) want += (want.empty() ? "" : ", ") + f.feature;
  for (const auto& n : s.inputs) have += (have.empty() ? "" : ", ") + n;
  if (want != have)
    throw bundle_error(where + ": fixed.inputs [" + have + "] differ from the target functions' [" + want + "]",
                       coreml::FIX);
  std::map<std::string, Dims> states = state_shapes(m.layout, s);
  bool same = states.size() == s.states.size();
  for (const auto& n : s.states) same = same && states.count(n);
  if (!same)
    throw bundle_error(where + ": fixed.states do not name the K and V state of every cached layer", coreml::FIX);
}

API_AVAILABLE(macos(15.0), ios(18.0))
std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_package(const std::string& folder,
                                                                                  const Manifest& m,
                                                                                  const std::string& units) {
  const std::string where = join_path(folder, MANIFEST_FILE);
  const GraphEntry& entry = m.graphs.at("target");
  auto program = std::make_shared<Program>();
  program->shapes = fixed_shapes(m.raw.at("graphs").at("target").get("fixed"), m.layout, "Core ML package", where,
                                 coreml::FIX);
  const bool state = m.binding == BINDING_STATE;
  if (state) check_state_lists(m, program->shapes, where);
  if (m.drafter && m.graphs.at("drafter").file != entry.file)  // (an eagle3 drafter's functions too: one package)
    throw bundle_error(where + ": the drafter function must live in the target's package " + entry.file +
                           " (one package, one state)",
                       coreml::FIX);
  const std::string package = join_path(folder, entry.file);
  const MLComputeUnits cu = coreml::compute_units(units);
  const std::string key = coreml::package_key(m, entry.file);
  NSURL* compiled = coreml::compiled_package(package, key, /*fresh=*/false);
  for (const auto& length : program->shapes.lengths) {
    auto features = target_features(m, program->shapes, length.first);
    try {
      program->targets[length.first] = coreml::load_function(compiled, package, length.second, cu,
                                                             features.first, features.second);
    } catch (const Error&) {  // the first function: maybe a stale or damaged cached .mlmodelc - compile once more
      if (!program->targets.empty()) throw;
      compiled = coreml::compiled_package(package, key, /*fresh=*/true);
      program->targets[length.first] = coreml::load_function(compiled, package, length.second, cu,
                                                             features.first, features.second);
    }
  }
  const bool eagle3 = m.drafter && m.drafter->is_eagle3();
  if (eagle3) {  // its step and fc functions at the target's lengths (its cache is function IO under either binding)
    const std::map<std::string, int> slots = {{DRAFT_KIND, m.drafter->draft_kv->max_context}};
    const std::map<int, std::string> steps = entry_lengths(m, "drafter", where, coreml::FIX);
    const std::map<int, std::string> fcs = entry_lengths(m, EAGLE3_FC_GRAPH, where, coreml::FIX);
    for (const auto& e : steps) {
      if (!fcs.count(e.first))
        throw bundle_error(where + ": the eagle3 step lengths differ from its fc lengths", coreml::FIX);
      auto step = drafter_features(m, "drafter", e.first, slots);
      program->eagle3_steps[e.first] = coreml::load_function(compiled, package, e.second, cu, step.first, step.second);
      auto fc = drafter_features(m, EAGLE3_FC_GRAPH, e.first, slots);
      program->eagle3_fcs[e.first] = coreml::load_function(compiled, package, fcs.at(e.first), cu, fc.first,
                                                           fc.second);
    }
    if (steps.size() != fcs.size())
      throw bundle_error(where + ": the eagle3 step lengths differ from its fc lengths", coreml::FIX);
  } else if (m.drafter) {
    auto features = drafter_features(m, "drafter", 1, program->shapes.slots);
    program->drafter = coreml::load_function(compiled, package, m.graphs.at("drafter").method, cu, features.first,
                                             features.second);
  }
  if (state) {  // one MLState for every function (identical declarations: the exporter checks, so does this)
    const std::map<std::string, Dims> states = state_shapes(m.layout, program->shapes);
    for (const auto& t : program->targets) coreml::check_states(t.second, states);
    if (m.drafter && !eagle3) coreml::check_states(program->drafter, states);
    for (const auto& f : program->eagle3_steps) coreml::check_states(f.second, {});  // an eagle3 drafter's: none
    for (const auto& f : program->eagle3_fcs) coreml::check_states(f.second, {});
    program->state = [program->targets.begin()->second.model newState];
  }
  const std::string identity = "Core ML (native), " + coreml::os_version() + ", compute units " +
                               (units.empty() ? std::string("all") : units) + ", " + m.binding + " binding";
  auto backend = std::make_unique<CoreMLBackend>(program, m, identity);
  std::unique_ptr<DrafterBackend> drafter;
  if (eagle3) {
    drafter = eagle3_drafter(program, *backend, m);
  } else if (m.drafter) {
    drafter = std::make_unique<CoreMLDrafter>(program, *backend, m);
  }
  return {std::move(backend), std::move(drafter)};
}

}  // namespace

std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_coreml(const std::string& folder,
                                                                                 const Manifest& m,
                                                                                 const std::string& compute_units) {
  if (!compute_units.empty()) check_compute_units(compute_units);
  if (@available(macOS 15.0, iOS 18.0, *)) {
    return pooled([&] { return open_package(folder, m, compute_units); });
  }
  throw backend_error(join_path(folder, m.graphs.at("target").file) + ": Core ML multifunction packages need macOS "
                          "15 / iOS 18 (one MLModel per function); this device runs " + coreml::os_version(),
                      "update the OS, or export the bundle for this device with --format executorch or onnx");
}

}  // namespace es

#endif  // ES_HAVE_COREML
