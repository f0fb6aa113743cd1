// qnn_backend.cpp - see qnn_backend.h. Read top to bottom: the target (runtimes/fixed.py FixedBackend: padded
// passes, the first pass through the host sink, commit), the drafter (FixedDrafter), opening the graphs (runtimes/qnn.py
// open_session / open_bundle). The fixed shapes, the IO check and the placed form's feeds are in qnn_fixed.h.
//
// Compiled only with ES_HAVE_ORT (an empty file otherwise; engine.cpp then refuses qnn bundles).
#ifdef ES_HAVE_ORT
#include "qnn_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include "contract_names.h"
#include "errors.h"
#include "fixed.h"
#include "fixed_eagle3.h"
#include "ort_common.h"
#include "qnn_ep.h"
#include "qnn_fixed.h"

namespace es {

using namespace contract;  // the graph IO names and formats (contract_names.h, generated)

const char* const QNN_PROVIDER_ENV = "EDGE_SPEC_QNN_PROVIDER";

namespace {

using qnn::FIX;
using qnn::FixedShapes;
using qnn::Graph;
const std::string RUN_FIX = "check the bundle with `edge-spec check --bundle B`; " + std::string(FIX);

// One pass's real rows: logits [t, V], hidden [t, H], per cached layer the new keys and values [H_kv, t, D]; an
// eagle3 bundle's target: its aux states [t, aux_width].
struct Rows {
  int t = 0;
  std::vector<float> logits, hidden, aux;
  std::vector<std::vector<float>> k, v;
};

// ---- the target ----------------------------------------------------------------------------------------------------
class QnnBackend : public Backend {
 public:
  QnnBackend(std::shared_ptr<Ort::Env> env, std::map<int, Graph> graphs, std::unique_ptr<Graph> sink,
             const Manifest& m, FixedShapes fixed, std::string identity, std::map<int64_t, Rows> table)
      : shapes(std::move(fixed)), aux_width(aux_size(m.graphs.at("target").io)), env_(std::move(env)),
        graphs_(std::move(graphs)), sink_(std::move(sink)),
        table_(std::move(table)), layout_(m.layout), vocab_(m.vocab_size), hidden_(m.hidden_size),
        identity_(std::move(identity)) {
    for (const auto& c : layout_.caches) {
      const size_t n = size_t(c.num_kv_heads) * shapes.slots.at(c.kind) * c.head_dim;
      k.emplace_back(n, 0.0f);
      v.emplace_back(n, 0.0f);
    }
  }

  const KVLayout& layout() const override { return layout_; }
  int vocab_size() const override { return vocab_; }
  int hidden_size() const override { return hidden_; }
  std::string identity() const override { return identity_; }
  // no buckets: every pass binds all S_f slots (bucket_size 0, as FixedBackend has none)
  int64_t first_token() const override { return table_.empty() ? -1 : table_.begin()->first; }

  StepOutput forward(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const Masks& masks,
                     int64_t n_cached, bool last_only) override {
    const int t = int(ids.size());
    pending_ = n_cached == 0 && sink_takes(ids[0]) ? first_pass(ids, positions, masks)
                                                   : run(graph_for(t), ids, positions, masks);
    if (aux_width && aux_record) aux_record->record(ids.data(), positions.data(), pending_.aux.data(), t);
    const int first = last_only ? t - 1 : 0;
    StepOutput out;
    out.rows = t - first;
    out.logits.assign(pending_.logits.begin() + size_t(first) * vocab_, pending_.logits.end());
    out.hidden.assign(pending_.hidden.begin() + size_t(first) * hidden_, pending_.hidden.end());
    return out;
  }

  void commit(const CommitPlan& plan) override {  // the `io` binding: the runner writes the accepted rows
    if (!pending_.t) throw kv_state_error("commit without a forward", "call forward before commit");
    for (size_t i = 0; i < layout_.caches.size(); ++i) {
      const CacheSpec& c = layout_.caches[i];
      const auto& rows = plan.at(c.kind).first;
      const auto& slots = plan.at(c.kind).second;
      const size_t s_f = size_t(shapes.slots.at(c.kind)), d = size_t(c.head_dim), t = size_t(pending_.t);
      for (int h = 0; h < c.num_kv_heads; ++h)
        for (size_t j = 0; j < rows.size(); ++j) {
          const size_t src = (h * t + size_t(rows[j])) * d, dst = (h * s_f + size_t(slots[j])) * d;
          std::memcpy(k[i].data() + dst, pending_.k[i].data() + src, d * sizeof(float));
          std::memcpy(v[i].data() + dst, pending_.v[i].data() + src, d * sizeof(float));
        }
    }
    pending_ = Rows();
  }

  void reset() override { pending_ = Rows(); }  // stale rows stay in the caches; KVState's masks hide them

  const FixedShapes shapes;
  // An eagle3 bundle's target also returns AUX_HIDDEN [1, T, aux_width] (0: it does not); after each pass its rows
  // go to `aux_record` (set by the eagle3 drafter, which owns it: fixed_eagle3.h), with the pass's ids and positions.
  const int aux_width;
  AuxRecord* aux_record = nullptr;
  std::vector<std::vector<float>> k, v;  // per cached layer [1, H_kv, S_f, D]
  Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);

 private:
  // runtimes/fixed.py sink_takes: the sink (graph, or precomputed table) holds position 0 for `token`; a first token
  // the table lacks runs through the graphs, with a notice on stderr (once).
  bool sink_takes(int64_t token) {
    if (sink_) return true;
    if (table_.empty()) return false;
    if (table_.count(token)) return true;
    if (!told_) {
      told_ = true;
      std::string held;
      for (const auto& e : table_) held += (held.empty() ? "" : ", ") + std::to_string(e.first);
      std::fprintf(stderr, "notice: this bundle precomputes position 0 only for first tokens [%s]; this prompt starts "
                   "with %lld, so its first row runs through the quantized graphs (answers may degrade; use --chat, or "
                   "a bundle exported with --qnn-position0 graph)\n", held.c_str(), static_cast<long long>(token));
    }
    return false;
  }

  Graph& graph_for(int t) {  // runtimes/fixed.py length_for: the smallest exported length >= t
    auto it = graphs_.lower_bound(t);
    if (it == graphs_.end())
      throw config_error("one forward over " + std::to_string(t) + " tokens exceeds this bundle's longest graph (" +
                             std::to_string(graphs_.rbegin()->first) + " tokens)",
                         "use a smaller --spec-k, or re-export with --max-pass");
    return it->second;
  }

  // One padded call of `g` (length n >= t) over t real rows; masks: kind -> [t, S + t].
  Rows run(Graph& g, const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const Masks& masks) {
    const int t = int(ids.size()), n = g.n;
    ids_.resize(size_t(n));
    pos_.resize(size_t(n));
    for (int i = 0; i < n; ++i) {  // pad rows: the last token again, at the next positions
      ids_[i] = int32_t(i < t ? ids[i] : ids[t - 1]);
      pos_[i] = int32_t(i < t ? positions[i] : positions[t - 1] + 1 + (i - t));
    }
    std::map<std::string, Ort::Value> in, out;
    in.emplace(INPUT_IDS, ort::tensor(cpu, ids_.data(), {1, n}));  // [1, n] int32
    in.emplace(POSITION_IDS, ort::tensor(cpu, pos_.data(), {1, n}));
    for (const auto& kind : layout_.kinds()) {
      const int s = layout_.slots(kind), s_f = shapes.slots.at(kind);
      auto& f = feeds_[kind];
      f.mask.resize(size_t(n) * s_f);
      f.keep.resize(size_t(n) * s_f);
      f.index.resize(size_t(s_f));
      qnn::slot_feeds(masks.at(kind), positions, n, s, s_f, kind == SLIDING, shapes.mask_floor, f.mask.data(),
                      f.keep.data(), f.index.data());
      in.emplace(mask_name(kind), ort::tensor(cpu, f.mask.data(), {1, 1, n, s_f}));  // [1, 1, n, S_f]
      in.emplace("keep." + kind, ort::tensor(cpu, f.keep.data(), {1, 1, n, s_f}));
      in.emplace("slot_index." + kind, ort::tensor(cpu, f.index.data(), {s_f}));  // [S_f] int32
    }
    logits_.resize(size_t(n) * vocab_);
    hiddens_.resize(size_t(n) * hidden_);
    out.emplace(LOGITS, ort::tensor(cpu, logits_.data(), {1, n, vocab_}));    // [1, n, V]
    out.emplace(HIDDEN, ort::tensor(cpu, hiddens_.data(), {1, n, hidden_}));  // [1, n, H]
    if (aux_width) {
      aux_.resize(size_t(n) * size_t(aux_width));
      out.emplace(AUX_HIDDEN, ort::tensor(cpu, aux_.data(), {1, n, int64_t(aux_width)}));  // [1, n, n_aux * H]
    }
    k_new_.resize(layout_.caches.size());
    v_new_.resize(layout_.caches.size());
    for (size_t i = 0; i < layout_.caches.size(); ++i) {
      const CacheSpec& c = layout_.caches[i];
      const int64_t h = c.num_kv_heads, s_f = shapes.slots.at(c.kind), d = c.head_dim;
      const std::string layer = std::to_string(c.layer);
      in.emplace(k_cache_name(layer), ort::tensor(cpu, k[i].data(), {1, h, s_f, d}));  // [1, H_kv, S_f, D]
      in.emplace(v_cache_name(layer), ort::tensor(cpu, v[i].data(), {1, h, s_f, d}));
      k_new_[i].resize(size_t(h * n * d));
      v_new_[i].resize(size_t(h * n * d));
      out.emplace(k_new_name(layer), ort::tensor(cpu, k_new_[i].data(), {1, h, n, d}));  // [1, H_kv, n, D]
      out.emplace(v_new_name(layer), ort::tensor(cpu, v_new_[i].data(), {1, h, n, d}));
    }
    const double start = ort::now_s();
    ort::run(g.session, g.io.input_names, in, g.io.output_names, out, g.path, RUN_FIX);
    kernel_s += ort::now_s() - start;
    Rows r;  // the real rows
    r.t = t;
    r.logits.assign(logits_.begin(), logits_.begin() + size_t(t) * vocab_);
    r.hidden.assign(hiddens_.begin(), hiddens_.begin() + size_t(t) * hidden_);
    if (aux_width) r.aux.assign(aux_.begin(), aux_.begin() + ptrdiff_t(size_t(t) * size_t(aux_width)));
    for (size_t i = 0; i < layout_.caches.size(); ++i) {
      const size_t h = size_t(layout_.caches[i].num_kv_heads), d = size_t(layout_.caches[i].head_dim);
      r.k.emplace_back(h * t * d);
      r.v.emplace_back(h * t * d);
      for (size_t j = 0; j < h; ++j) {  // [H_kv, n, D] -> [H_kv, t, D]
        std::memcpy(r.k[i].data() + j * t * d, k_new_[i].data() + j * n * d, t * d * sizeof(float));
        std::memcpy(r.v[i].data() + j * t * d, v_new_[i].data() + j * n * d, t * d * sizeof(float));
      }
    }
    return r;
  }

  // runtimes/fixed.py first_pass: a pass from position 0 over an empty cache: row 0 through the sink, then (t > 1)
  // rows 1.. through the graphs with row 0's keys and values in slot 0 (position 0's slot in full layers and rings)
  // and its mask column moved there; the slot is emptied again afterwards (commit writes it).
  Rows first_pass(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const Masks& masks) {
    const int t = int(ids.size());
    Masks first, rest;
    for (const auto& e : masks) {
      const Mask& m = e.second;
      const int s = layout_.slots(e.first);
      Mask& a = first[e.first];  // [1, s + 1]: row 0 sees its own new column
      a.rows = 1;
      a.cols = s + 1;
      a.data.assign(m.data.begin(), m.data.begin() + s + 1);
      Mask& b = rest[e.first];  // [t - 1, s + t - 1]: new column 0 becomes cache slot 0
      b.rows = t - 1;
      b.cols = s + t - 1;
      for (int r = 1; r < t; ++r) {
        const float* row = m.data.data() + size_t(r) * m.cols;
        b.data.insert(b.data.end(), row, row + s);
        b.data[b.data.size() - s] = row[s];
        b.data.insert(b.data.end(), row + s + 1, row + s + t);
      }
    }
    Rows head = sink_ ? run(*sink_, {ids[0]}, {positions[0]}, first) : table_.at(ids[0]);
    if (t == 1) return head;
    slot0(&head);
    Rows more;
    try {
      more = run(graph_for(t - 1), std::vector<int64_t>(ids.begin() + 1, ids.end()),
                 std::vector<int64_t>(positions.begin() + 1, positions.end()), rest);
    } catch (...) {
      slot0(nullptr);
      throw;
    }
    slot0(nullptr);
    Rows all;  // row 0, then rows 1..
    all.t = t;
    all.logits = head.logits;
    all.logits.insert(all.logits.end(), more.logits.begin(), more.logits.end());
    all.hidden = head.hidden;
    all.hidden.insert(all.hidden.end(), more.hidden.begin(), more.hidden.end());
    all.aux = head.aux;
    all.aux.insert(all.aux.end(), more.aux.begin(), more.aux.end());
    for (size_t i = 0; i < layout_.caches.size(); ++i) {
      const size_t h = size_t(layout_.caches[i].num_kv_heads), d = size_t(layout_.caches[i].head_dim);
      all.k.push_back(join_rows(head.k[i], more.k[i], h, t - 1, d));
      all.v.push_back(join_rows(head.v[i], more.v[i], h, t - 1, d));
    }
    return all;
  }

  // [H_kv, 1, D] + [H_kv, t, D] -> [H_kv, 1 + t, D]
  static std::vector<float> join_rows(const std::vector<float>& a, const std::vector<float>& b, size_t h, size_t t,
                                      size_t d) {
    std::vector<float> out;
    out.reserve(h * (1 + t) * d);
    for (size_t j = 0; j < h; ++j) {
      out.insert(out.end(), a.begin() + j * d, a.begin() + (j + 1) * d);
      out.insert(out.end(), b.begin() + j * t * d, b.begin() + (j + 1) * t * d);
    }
    return out;
  }

  // Slot 0 of every cache: row 0's keys and values (`row`: one pass of one row), or zeros (nullptr).
  void slot0(const Rows* row) {
    for (size_t i = 0; i < layout_.caches.size(); ++i) {
      const CacheSpec& c = layout_.caches[i];
      const size_t s_f = size_t(shapes.slots.at(c.kind)), d = size_t(c.head_dim);
      for (size_t h = 0; h < size_t(c.num_kv_heads); ++h) {
        float* kd = k[i].data() + h * s_f * d;
        float* vd = v[i].data() + h * s_f * d;
        if (row) {
          std::memcpy(kd, row->k[i].data() + h * d, d * sizeof(float));
          std::memcpy(vd, row->v[i].data() + h * d, d * sizeof(float));
        } else {
          std::fill(kd, kd + d, 0.0f);
          std::fill(vd, vd + d, 0.0f);
        }
      }
    }
  }

  struct KindFeeds {
    std::vector<float> mask, keep;  // [n, S_f]
    std::vector<int32_t> index;     // [S_f]
  };
  std::shared_ptr<Ort::Env> env_;  // outlives the sessions (declared first: destroyed last)
  std::map<int, Graph> graphs_;    // pass length -> graph
  std::unique_ptr<Graph> sink_;
  std::map<int64_t, Rows> table_;  // --qnn-position0 table: first token -> position 0's row
  bool told_ = false;
  KVLayout layout_;
  int vocab_, hidden_;
  std::string identity_;
  std::vector<int32_t> ids_, pos_;  // [1, n]
  std::map<std::string, KindFeeds> feeds_;
  std::vector<float> logits_, hiddens_, aux_;
  std::vector<std::vector<float>> k_new_, v_new_;  // per cached layer [1, H_kv, n, D]
  Rows pending_;                                   // the last forward's real rows (t = 0: none)
};


// ---- the drafter: one draft step over the target's caches (its kv_sharing source layers) ---------------------
class QnnDrafter : public DrafterBackend {
 public:
  QnnDrafter(std::shared_ptr<Ort::Env> env, Graph graph, QnnBackend& target, const Manifest& m)
      : env_(std::move(env)), graph_(std::move(graph)), target_(target), layout_(m.layout),
        candidates_(m.drafter->candidates_per_step), hidden_size_(m.hidden_size) {
    for (const auto& share : m.drafter->kv_sharing)  // std::map: sorted by kind (kv.source_caches)
      for (size_t i = 0; i < layout_.caches.size(); ++i)
        if (layout_.caches[i].layer == share.second) sources_.emplace_back(share.first, i);
    out_ids_.resize(size_t(candidates_));
    out_logits_.resize(size_t(candidates_));
    out_hidden_.resize(size_t(hidden_size_));
  }

  // The burst starts at the bonus token's position; masks: kind -> [1, S_kind] -> [1, 1, 1, S_f], the rest masked.
  void begin(int64_t position, const Masks& masks, int64_t) override {
    position_ = int32_t(position);
    const float floor = target_.shapes.mask_floor;
    for (const auto& src : sources_) {
      const Mask& m = masks.at(src.first);
      const int s = layout_.slots(src.first);
      std::vector<float>& dst = masks_[src.first];
      dst.assign(size_t(target_.shapes.slots.at(src.first)), floor);
      for (int j = 0; j < s; ++j) dst[j] = std::max(m.data[j], floor);
    }
  }

  Graph& graph() { return graph_; }
  const std::vector<std::pair<std::string, size_t>>& sources() const { return sources_; }

  DraftStep step(int64_t token, const std::vector<float>& hidden) override {
    token_ = int32_t(token);
    hidden_ = hidden;
    pos_ = position_;
    Ort::MemoryInfo& cpu = target_.cpu;
    std::map<std::string, Ort::Value> in, out;
    in.emplace(INPUT_IDS, ort::tensor(cpu, &token_, {1, 1}));                        // [1, 1] int32
    in.emplace(HIDDEN, ort::tensor(cpu, hidden_.data(), {1, 1, hidden_size_}));      // [1, 1, H]
    in.emplace(POSITION_IDS, ort::tensor(cpu, &pos_, {1, 1}));                       // [1, 1] int32
    for (const auto& src : sources_) {
      const CacheSpec& c = layout_.caches[src.second];
      const int64_t h = c.num_kv_heads, s_f = target_.shapes.slots.at(c.kind), d = c.head_dim;
      const std::string layer = std::to_string(c.layer);
      in.emplace(mask_name(src.first), ort::tensor(cpu, masks_[src.first].data(), {1, 1, 1, s_f}));
      in.emplace(k_cache_name(layer), ort::tensor(cpu, target_.k[src.second].data(), {1, h, s_f, d}));  // read in place
      in.emplace(v_cache_name(layer), ort::tensor(cpu, target_.v[src.second].data(), {1, h, s_f, d}));
    }
    out.emplace(DRAFT_TOKEN_IDS, ort::tensor(cpu, out_ids_.data(), {candidates_}));  // [N] int32
    out.emplace(DRAFT_LOGITS, ort::tensor(cpu, out_logits_.data(), {candidates_}));  // [N]
    out.emplace(DRAFT_HIDDEN, ort::tensor(cpu, out_hidden_.data(), {1, 1, hidden_size_}));
    const double start = ort::now_s();
    ort::run(graph_.session, graph_.io.input_names, in, graph_.io.output_names, out, graph_.path, RUN_FIX);
    kernel_s += ort::now_s() - start;
    return DraftStep{std::vector<int64_t>(out_ids_.begin(), out_ids_.end()), out_logits_, out_hidden_};
  }

 private:
  std::shared_ptr<Ort::Env> env_;
  Graph graph_;
  QnnBackend& target_;
  KVLayout layout_;
  int64_t candidates_, hidden_size_;
  std::vector<std::pair<std::string, size_t>> sources_;  // kind -> index into layout.caches
  std::map<std::string, std::vector<float>> masks_;
  int32_t position_ = 0, token_ = 0, pos_ = 0;
  std::vector<float> hidden_;
  std::vector<int32_t> out_ids_;
  std::vector<float> out_logits_, out_hidden_;
};

// ---- position 0 precomputed (runtimes/qnn.py table_sink; the layout: runtimes/qnn_htp.py position0_file) ----------
std::map<int64_t, Rows> read_position0(const std::string& folder, const FixedShapes& shapes, const Manifest& m) {
  std::map<int64_t, Rows> table;
  if (shapes.position0.empty()) return table;
  const std::string path = join_path(folder, shapes.position0);
  const size_t aux_width = size_t(aux_size(m.graphs.at("target").io));  // an eagle3 bundle's: its aux states last
  size_t per = size_t(m.vocab_size) + size_t(m.hidden_size) + aux_width;
  for (const auto& c : m.layout.caches) per += 2 * size_t(c.num_kv_heads) * size_t(c.head_dim);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw bundle_error(path + " is missing from the bundle", FIX);
  const size_t bytes = size_t(in.tellg()), want = per * shapes.position0_tokens.size() * sizeof(float);
  if (bytes != want)
    throw bundle_error(path + " holds " + std::to_string(bytes / sizeof(float)) + " floats; " +
                           std::to_string(shapes.position0_tokens.size()) + " tokens of this bundle's shapes need " +
                           std::to_string(want / sizeof(float)), FIX);
  in.seekg(0);
  std::vector<float> row(per);  // float32 little-endian (every platform the runner builds for)
  for (int64_t token : shapes.position0_tokens) {
    in.read(reinterpret_cast<char*>(row.data()), std::streamsize(per * sizeof(float)));
    Rows r;  // one row: logits [V], hidden [H], per cache k [H_kv, 1, D], v [H_kv, 1, D], then aux [n_aux * H]
    r.t = 1;
    const float* p = row.data();
    r.logits.assign(p, p + m.vocab_size);
    p += m.vocab_size;
    r.hidden.assign(p, p + m.hidden_size);
    p += m.hidden_size;
    for (const auto& c : m.layout.caches) {
      const size_t n = size_t(c.num_kv_heads) * size_t(c.head_dim);
      r.k.emplace_back(p, p + n);
      p += n;
      r.v.emplace_back(p, p + n);
      p += n;
    }
    r.aux.assign(p, p + aux_width);
    table[token] = std::move(r);
  }
  return table;
}

// ---- an eagle3 drafter: its step and fc graphs at each length (runtimes/qnn.py open_bundle; fixed_eagle3.h) --------
std::unique_ptr<DrafterBackend> open_eagle3(const qnn::Opener& o, const std::string& suffix, QnnBackend& target,
                                            const Manifest& m) {
  const std::string where = join_path(o.folder, MANIFEST_FILE);
  const KVLayout& draft = *m.drafter->draft_kv;
  const int64_t h = m.hidden_size, vd = m.drafter->draft_vocab_size, s = draft.max_context, w = target.aux_width;
  const std::map<int, std::string> steps = entry_lengths(m, "drafter", where, FIX);
  const std::map<int, std::string> fcs = entry_lengths(m, EAGLE3_FC_GRAPH, where, FIX);
  if (steps.size() != fcs.size() || !std::equal(steps.begin(), steps.end(), fcs.begin(),
                                                [](const auto& a, const auto& b) { return a.first == b.first; }))
    throw bundle_error(where + ": the eagle3 step lengths differ from its fc lengths", FIX);
  if (!w)
    throw bundle_error(where + ": the target graphs return no " + std::string(AUX_HIDDEN) + ", which an eagle3 drafter "
                       "reads", FIX);
  // the graphs, opened once and shared by the two callables
  auto step_graphs = std::make_shared<std::map<int, Graph>>(), fc_graphs = std::make_shared<std::map<int, Graph>>();
  FixedEagle3Graphs graphs;
  for (const auto& e : steps) {
    const int n = e.first;
    Graph g = o.open(std::string(qnn::QNN_DIR) + "/" + e.second + suffix, o.provider, n);
    qnn::check_io(g, qnn::eagle3_step_inputs(draft, n, h), qnn::eagle3_step_outputs(draft, n, h, vd));
    step_graphs->emplace(n, std::move(g));
    Graph f = o.open(std::string(qnn::QNN_DIR) + "/" + fcs.at(n) + suffix, o.provider, n);
    qnn::check_io(f, qnn::eagle3_fc_inputs(n, w), qnn::eagle3_fc_outputs(n, h));
    fc_graphs->emplace(n, std::move(f));
    graphs.lengths.push_back(n);
  }
  Ort::MemoryInfo* cpu = &target.cpu;
  graphs.step = [step_graphs, cpu, draft, h, vd, s](Eagle3StepCall& c) {
    Graph& g = step_graphs->at(c.n);
    const int64_t n = c.n;
    std::map<std::string, Ort::Value> in, out;
    in.emplace(INPUT_IDS, ort::tensor(*cpu, const_cast<int32_t*>(c.ids), {1, n}));  // onnxruntime never writes inputs
    in.emplace(HIDDEN, ort::tensor(*cpu, const_cast<float*>(c.hidden), {1, n, h}));
    in.emplace(POSITION_IDS, ort::tensor(*cpu, const_cast<int32_t*>(c.positions), {1, n}));
    in.emplace(DRAFT_MASK, ort::tensor(*cpu, const_cast<float*>(c.mask), {1, 1, n, s + n}));
    out.emplace(DRAFT_TOKEN_IDS, ort::tensor(*cpu, c.token_ids, {vd}));  // [Vd] int32
    out.emplace(DRAFT_LOGITS, ort::tensor(*cpu, c.logits, {vd}));
    out.emplace(DRAFT_HIDDEN, ort::tensor(*cpu, c.out_hidden, {1, 1, h}));
    for (size_t i = 0; i < draft.caches.size(); ++i) {
      const CacheSpec& l = draft.caches[i];
      const int64_t kv = l.num_kv_heads, d = l.head_dim;
      in.emplace(draft_k_cache_name(l.layer), ort::tensor(*cpu, (*c.k)[i].data(), {1, kv, s, d}));  // [1, H_kv, S, D]
      in.emplace(draft_v_cache_name(l.layer), ort::tensor(*cpu, (*c.v)[i].data(), {1, kv, s, d}));
      out.emplace(draft_k_new_name(l.layer), ort::tensor(*cpu, (*c.k_new)[i].data(), {1, kv, n, d}));  // [1, H_kv, n, D]
      out.emplace(draft_v_new_name(l.layer), ort::tensor(*cpu, (*c.v_new)[i].data(), {1, kv, n, d}));
    }
    ort::run(g.session, g.io.input_names, in, g.io.output_names, out, g.path, RUN_FIX);
  };
  graphs.fc = [fc_graphs, cpu, h, w](int n, const float* aux, float* fused) {
    Graph& g = fc_graphs->at(n);
    std::map<std::string, Ort::Value> in, out;
    in.emplace(AUX_HIDDEN, ort::tensor(*cpu, const_cast<float*>(aux), {1, int64_t(n), w}));  // [1, n, n_aux * H]
    out.emplace(FUSED_HIDDEN, ort::tensor(*cpu, fused, {1, int64_t(n), h}));               // [1, n, H]
    ort::run(g.session, g.io.input_names, in, g.io.output_names, out, g.path, RUN_FIX);
  };
  return std::make_unique<FixedEagle3Drafter>(std::move(graphs), draft, m.max_context(), int(w), int(h), int(vd),
                                              target.shapes.mask_floor, &target.aux_record);
}

// ---- opening the graphs (runtimes/qnn.py open_bundle) --------------------------------------------------------------
std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_graphs(const std::string& folder,
                                                                                 const Manifest& m, int threads,
                                                                                 const QnnOptions& options) {
  qnn::Opener o;
  o.provider = qnn::provider_of(options.provider);
  FixedShapes shapes = qnn::fixed_shapes(folder, m);
  if (o.provider == "cpu" && !shapes.cpu_graphs)
    throw config_error(folder + " was exported for a phone (--qnn-position0 table): it holds no QDQ graphs for the CPU "
                       "provider", "run it with --provider qnn, or re-export with --qnn-position0 graph");
  o.env = std::make_shared<Ort::Env>(ORT_LOGGING_LEVEL_ERROR, "edge-spec");
  o.folder = folder;
  o.threads = threads;
  o.soc = shapes.soc;
  std::string where = "CPU provider";
  if (o.provider == "qnn") {
    o.devices = qnn_devices(*o.env, qnn_ep_library(options.ep_library));
    where = "HTP " + shapes.soc.name + " (v" + std::to_string(shapes.soc.htp_arch) + "), " + qnn_ep_version(o.devices);
  }
  const std::string suffix = o.provider == "qnn" ? ".ctx.onnx" : ".qdq.onnx";
  std::map<int, Graph> graphs;
  for (const auto& e : shapes.lengths) {
    Graph g = o.open(std::string(qnn::QNN_DIR) + "/" + e.second + suffix, o.provider, e.first);
    qnn::check_io(g, qnn::target_inputs(m.layout, shapes, e.first),
                  qnn::target_outputs(m.layout, e.first, m.vocab_size, m.hidden_size, aux_size(m.graphs.at("target").io)));
    graphs.emplace(e.first, std::move(g));
  }
  std::unique_ptr<Graph> sink;
  if (!shapes.sink.empty()) {  // position 0 on the host CPU, float activations: the shortest graph's twin, padded
    const int n0 = shapes.lengths.begin()->first;
    sink = std::make_unique<Graph>(o.open(shapes.sink, "cpu", n0));
    qnn::check_io(*sink, qnn::target_inputs(m.layout, shapes, n0),
                  qnn::target_outputs(m.layout, n0, m.vocab_size, m.hidden_size, aux_size(m.graphs.at("target").io)));
  }
  std::map<int64_t, Rows> table = read_position0(folder, shapes, m);
  std::string how = sink ? ", position 0 on the CPU" : "";
  if (!table.empty()) {
    how = ", position 0 precomputed for tokens [";
    for (const auto& e : table) how += (how.back() == '[' ? "" : ", ") + std::to_string(e.first);
    how += "]";
  }
  const std::string identity = "qnn " + shapes.quant + " QDQ on " + where + how + ", onnxruntime " + ort::version() +
                               " (native), threads " + (threads ? std::to_string(threads) : std::string("default"));
  auto backend = std::make_unique<QnnBackend>(o.env, std::move(graphs), std::move(sink), m, shapes, identity,
                                              std::move(table));
  std::unique_ptr<DrafterBackend> drafter;
  if (m.drafter && m.drafter->is_eagle3()) {
    drafter = open_eagle3(o, suffix, *backend, m);
  } else if (m.drafter) {
    const GraphEntry& d = m.graphs.at("drafter");
    Graph g = o.open(std::string(qnn::QNN_DIR) + "/" + d.method + suffix, o.provider, 1);
    auto mtp = std::make_unique<QnnDrafter>(o.env, std::move(g), *backend, m);
    qnn::check_io(mtp->graph(), qnn::drafter_inputs(m.layout, shapes, mtp->sources(), m.hidden_size),
                  qnn::drafter_outputs(m.drafter->candidates_per_step, m.hidden_size));
    drafter = std::move(mtp);
  }
  return {std::move(backend), std::move(drafter)};
}

}  // namespace

std::pair<std::unique_ptr<Backend>, std::unique_ptr<DrafterBackend>> open_qnn(const std::string& folder,
                                                                              const Manifest& m, int threads,
                                                                              const QnnOptions& options) {
  if (threads < 0) throw config_error("threads must be >= 0, got " + std::to_string(threads), "use --threads 2");
  ort::check_api();
  if (m.binding != BINDING_IO)
    throw bundle_error(join_path(folder, MANIFEST_FILE) + ": the qnn backend runs the `io` binding, this bundle's is '" +
                           m.binding + "'",
                       FIX);
  try {
    return open_graphs(folder, m, threads, options);
  } catch (const Ort::Exception& err) {  // anything open_session / qnn_devices did not name
    throw backend_error("onnxruntime " + ort::version() + ": " + ort::first_line(err.what()),
                        "check the bundle with `edge-spec check --bundle " + folder + "`");
  }
}

}  // namespace es

#endif  // ES_HAVE_ORT
