// manifest.cpp - see manifest.h. Mirrors edge_spec/contract/manifest.py read_manifest (same checks, same order).
#include "manifest.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "contract_names.h"
#include "errors.h"
#include "manifest_check.h"
#include "sha256.h"

namespace es {

namespace {

const char* const REEXPORT = "re-run `edge-spec export` into a fresh --out folder";

// edge_spec/contract/formats.py FORMATS (contract_names.h, generated from it): what the manifest check needs of it
const std::vector<contract::FormatRow>& formats() { return contract::format_rows(); }

bool contains(const std::vector<std::string>& v, const std::string& x) {
  for (const auto& s : v)
    if (s == x) return true;
  return false;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& p, int64_t* size = nullptr) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (size) *size = int64_t(st.st_size);
  return true;
}

std::string dim_text(const Json& d) { return d.is_number() ? std::to_string(d.as_int()) : d.as_string(); }

TensorSpec spec(const std::string& name, const std::string& dtype, std::vector<std::string> shape) {
  return TensorSpec{name, dtype, std::move(shape)};
}

GraphEntry graph_from_json(const Json& d) {
  GraphEntry g;
  g.file = d.at("file").as_string();
  g.precision = d.at("precision").as_string();
  for (const char* role : {"inputs", "outputs"}) {
    auto& list = std::string(role) == "inputs" ? g.io.inputs : g.io.outputs;
    for (const auto& t : d.at(role).as_array()) {
      TensorSpec s{t.at("name").as_string(), t.at("dtype").as_string(), {}};
      for (const auto& dim : t.at("shape").as_array()) s.shape.push_back(dim_text(dim));
      list.push_back(s);
    }
  }
  if (d.has("method") && !d.at("method").is_null()) g.method = d.at("method").as_string();
  if (d.has("data") && !d.at("data").is_null()) g.data = d.at("data").as_string();
  return g;
}

Manifest from_json(const Json& d) {
  Manifest m;
  m.raw = d;
  m.schema_version = int(d.at("schema_version").as_int());
  m.format = d.at("format").as_string();
  m.precision = d.at("precision").as_string();
  m.created_by = d.get("created_by").is_string() ? d.at("created_by").as_string() : "";
  const Json& t = d.at("target");
  m.target_name = t.at("name").as_string();
  m.target_content_sha256 = t.at("content_sha256").as_string();
  const Json& dr = d.get("drafter");
  if (!dr.is_null()) {
    DrafterEntry e;
    if (dr.get("kind").is_string()) e.kind = dr.at("kind").as_string();
    e.name = dr.at("name").as_string();
    e.content_sha256 = dr.at("content_sha256").as_string();
    e.target_content_sha256 = dr.get("target_content_sha256").is_string() ? dr.at("target_content_sha256").as_string() : "";
    for (const auto& kv : dr.get("kv_sharing").is_object() ? dr.at("kv_sharing").as_object() : std::map<std::string, Json>{})
      e.kv_sharing[kv.first] = int(kv.second.as_int());
    e.head_from = dr.get("head_from").is_string() ? dr.at("head_from").as_string() : "drafter";
    e.candidates_per_step = dr.get("candidates_per_step").is_number() ? int(dr.at("candidates_per_step").as_int()) : 0;
    if (dr.get("aux_layers").is_array())
      for (const auto& id : dr.at("aux_layers").as_array()) e.aux_layers.push_back(int(id.as_int()));
    e.draft_vocab_size = dr.get("draft_vocab_size").is_number() ? int(dr.at("draft_vocab_size").as_int()) : 0;
    if (dr.get("draft_kv").is_object()) {
      try {
        e.draft_kv = layout_from_json(dr.at("draft_kv"));
      } catch (const JsonError&) {  // left unset: verify_contract refuses it as malformed
      }
    }
    m.drafter = e;
  }
  const Json& kv = d.at("kv");
  m.binding = kv.at("binding").as_string();
  m.layout = layout_from_json(kv.at("layout"));
  m.vocab_size = int(d.at("vocab_size").as_int());
  m.hidden_size = int(d.at("hidden_size").as_int());
  m.embed_scale = d.at("embed_scale").as_number();
  const Json& tok = d.at("tokenizer");
  m.bos_token_id = tok.at("bos_token_id").is_null() ? -1 : int(tok.at("bos_token_id").as_int());
  for (const auto& e : tok.at("eos_token_ids").as_array()) m.eos_token_ids.push_back(int(e.as_int()));
  m.chat_template = tok.at("chat_template").is_null() ? "" : tok.at("chat_template").as_string();
  for (const auto& f : tok.at("files").as_array()) m.tokenizer_files.push_back(f.as_string());
  m.max_draft_len = int(d.at("max_draft_len").as_int());
  for (const auto& g : d.at("graphs").as_object()) m.graphs[g.first] = graph_from_json(g.second);
  for (const auto& tb : d.at("tables").as_object()) m.tables[tb.first] = tb.second.at("file").as_string();
  for (const auto& f : d.at("files").as_object()) {
    if (!f.second.is_object() || !f.second.has("sha256") || !f.second.has("bytes"))
      throw JsonError("file entry '" + f.first + "' lacks sha256/bytes");
    m.files[f.first] = FileEntry{f.second.at("sha256").as_string(), f.second.at("bytes").as_int()};
  }
  return m;
}

void verify_files(const std::string& folder, const Manifest& m, bool checksums) {
  const std::string manifest_path = join_path(folder, MANIFEST_FILE);
  for (const auto& f : m.files) {
    const std::string& rel = f.first;
    if (!rel.empty() && rel[0] == '/')
      throw bundle_error(manifest_path + ": file entry '" + rel + "' points outside the bundle", REEXPORT);
    std::stringstream parts(rel);
    std::string part;
    while (std::getline(parts, part, '/'))
      if (part == "..") throw bundle_error(manifest_path + ": file entry '" + rel + "' points outside the bundle", REEXPORT);
  }
  std::vector<std::string> referenced;
  for (const auto& g : m.graphs) {
    referenced.push_back(g.second.file);
    if (!g.second.data.empty()) referenced.push_back(g.second.data);
  }
  for (const auto& t : m.tables) referenced.push_back(t.second);
  for (const auto& t : m.tokenizer_files) referenced.push_back(t);
  for (const auto& rel : referenced) {  // a file, or a folder artifact (an .mlpackage) whose files are all listed
    bool listed = m.files.count(rel) > 0;
    for (const auto& f : m.files)
      if (f.first.compare(0, rel.size() + 1, rel + "/") == 0) listed = true;
    if (!listed) throw bundle_error(manifest_path + ": " + rel + " is used but has no checksum entry", REEXPORT);
  }
  for (const auto& f : m.files) {
    const std::string path = join_path(folder, f.first);
    int64_t size = 0;
    if (!is_file(path, &size))
      throw bundle_error(path + " is missing from the bundle", std::string("copy the whole bundle folder, or ") + REEXPORT);
    if (size != f.second.bytes)
      throw bundle_error(path + " is truncated or altered: " + std::to_string(size) + " bytes, the manifest says " +
                             std::to_string(f.second.bytes),
                         std::string("copy the file again from the original bundle, or ") + REEXPORT);
    if (checksums && sha256_file(path) != f.second.sha256)
      throw bundle_error(path + " is corrupt: its sha256 does not match the manifest",
                         std::string("copy the file again from the original bundle, or ") + REEXPORT);
  }
}

void same_io(const std::string& where, const GraphIO& got, const GraphIO& want) {
  for (int pass = 0; pass < 2; ++pass) {
    const auto& a = pass == 0 ? got.inputs : got.outputs;
    const auto& b = pass == 0 ? want.inputs : want.outputs;
    const std::string role = pass == 0 ? "input" : "output";
    if (a.size() != b.size())
      throw bundle_error(where + " has " + std::to_string(a.size()) + " " + role + "s, the KV contract expects " +
                             std::to_string(b.size()),
                         REEXPORT);
    for (size_t i = 0; i < a.size(); ++i)
      if (!(a[i] == b[i]))
        throw bundle_error(where + " " + role + " " + std::to_string(i) + " is " + a[i].describe() +
                               ", the KV contract expects " + b[i].describe(),
                           REEXPORT);
  }
}

// manifest.py _check_aux: the target graph returns AUX_HIDDEN exactly when the drafter is an eagle3 one, as wide as
// its aux layers; a drafter kind this runner does not know is refused.
void check_aux(const Manifest& m, const GraphIO& target, const std::string& path) {
  const std::string kind = m.drafter ? m.drafter->kind : "";
  if (m.drafter && kind != contract::DRAFTER_MTP && kind != contract::DRAFTER_EAGLE3)
    throw bundle_error(path + ": drafter kind '" + kind + "' is not one this edge-spec runs (" + contract::DRAFTER_MTP +
                           ", " + contract::DRAFTER_EAGLE3 + ")",
                       std::string("update edge-spec, or ") + REEXPORT);
  const int got = aux_size(target);
  const int need = m.drafter && m.drafter->is_eagle3() ? int(m.drafter->aux_layers.size()) * m.hidden_size : 0;
  if (need && !got) {
    std::string layers;
    for (int id : m.drafter->aux_layers) layers += (layers.empty() ? "" : ", ") + std::to_string(id);
    throw bundle_error(path + ": the eagle3 drafter reads the target's hidden states at layers [" + layers +
                           "], but the target graph has no " + contract::AUX_HIDDEN + " output",
                       "re-export the pair with this edge-spec: edge-spec export --model M --drafter EAGLE3_FOLDER "
                       "(the target graph then returns them)");
  }
  if (got != need) {
    const std::string has = need ? "an eagle3 drafter reading " + std::to_string(need / m.hidden_size) + " aux layers"
                                 : std::string("no eagle3 drafter");
    throw bundle_error(path + ": the target graph returns " + contract::AUX_HIDDEN + " of width " +
                           std::to_string(got) + ", but the bundle has " + has + " (width " + std::to_string(need) + ")",
                       REEXPORT);
  }
}

// manifest.py _verify_eagle3: a format whose native backend runs it (every shipped one: onnx, executorch, qnn, coreml;
// the Core ML backend is built for Apple platforms only), no kv_sharing, its own cache
// layout (`io`, or `state` beside a `state` target) of kind DRAFT_KIND with more slots than max_context, and its two
// graphs' IO.
void verify_eagle3(const Manifest& m, const std::string& path) {
  const DrafterEntry& d = *m.drafter;
  if (m.format != contract::FORMAT_ONNX && m.format != contract::FORMAT_EXECUTORCH && m.format != contract::FORMAT_QNN &&
      m.format != contract::FORMAT_COREML)
    throw bundle_error(path + ": an eagle3 drafter in a " + m.format + " bundle; the native runner runs eagle3 drafters "
                           "in " + contract::FORMAT_ONNX + ", " + contract::FORMAT_EXECUTORCH + ", " +
                           contract::FORMAT_QNN + " and " + contract::FORMAT_COREML + " bundles",
                       std::string("re-export with --format ") + contract::FORMAT_ONNX +
                           ", or with an MTP drafter (--drafter builtin:mtp)");
  if (!d.kv_sharing.empty() || !m.raw.at("drafter").get("draft_kv").is_object() || d.draft_vocab_size <= 0 ||
      d.draft_vocab_size > m.vocab_size)
    throw bundle_error(path + ": the eagle3 drafter entry needs draft_kv, draft_vocab_size in [1, " +
                           std::to_string(m.vocab_size) + "] and no kv_sharing",
                       REEXPORT);
  if (!d.draft_kv) throw bundle_error(path + ": the eagle3 drafter's draft_kv is malformed", REEXPORT);
  const KVLayout& draft = *d.draft_kv;
  const std::vector<std::string> kinds = draft.kinds();
  bool keeps = false;  // a `state` program keeps both caches (FormatRow::eagle3_state), else the drafter's stays `io`
  for (const auto& row : contract::format_rows())
    if (m.format == row.name) keeps = m.layout.binding == BINDING_STATE && row.eagle3_state;
  const std::string binding = keeps ? BINDING_STATE : BINDING_IO;
  if (draft.binding != binding || kinds.size() != 1 || kinds[0] != contract::DRAFT_KIND ||
      draft.max_context <= m.max_context())
    throw bundle_error(path + ": the eagle3 drafter's cache layout must be `" + binding + "` (a " + m.format +
                           " bundle's with a `" + m.layout.binding + "` target), kind '" + contract::DRAFT_KIND +
                           "', with more slots than max_context " + std::to_string(m.max_context()),
                       REEXPORT);
  for (const std::string& name : {std::string("drafter"), std::string(contract::EAGLE3_FC_GRAPH)})
    if (!m.graphs.count(name))
      throw bundle_error(path + ": the eagle3 drafter entry has no '" + name + "' graph", REEXPORT);
  const GraphIO& io = m.graphs.at("drafter").io;
  bool shared = false;  // it gathers the target's table (else keeps its own)
  for (const auto& t : io.inputs)
    for (const std::string& name : contract::TARGET_TABLES) shared = shared || t.name == name;
  same_io(path + ": drafter graph", io,
          eagle3_drafter_io(draft, m.hidden_size, d.draft_vocab_size,
                            shared ? table_specs(m.vocab_size, m.hidden_size, table_bits(m)) : std::vector<TensorSpec>{}));
  same_io(path + ": " + contract::EAGLE3_FC_GRAPH + " graph", m.graphs.at(contract::EAGLE3_FC_GRAPH).io,
          eagle3_fc_io(int(d.aux_layers.size()) * m.hidden_size, m.hidden_size));
}

void verify_contract(const Manifest& m, const std::string& path) {
  const contract::FormatRow* fmt = nullptr;
  std::string names;
  for (const auto& row : formats()) {
    if (m.format == row.name) fmt = &row;
    names += std::string(names.empty() ? "" : ", ") + row.name;
  }
  if (!fmt)
    throw bundle_error(path + ": format '" + m.format + "' is not one this edge-spec reads (" + names + ")",
                       "update edge-spec, or re-export the bundle with --format onnx|executorch|coreml|qnn");
  if (!contains(fmt->bindings, m.binding) || m.layout.binding != m.binding)
    throw bundle_error(path + ": KV binding '" + m.binding + "' (layout '" + m.layout.binding +
                           "') is not one the " + m.format + " format uses",
                       REEXPORT);
  if (!contains(fmt->precisions, m.precision))
    throw bundle_error(path + ": unknown precision '" + m.precision + "' for the " + m.format + " format", REEXPORT);
  if (!m.graphs.count("target")) throw bundle_error(path + ": the bundle has no target graph", REEXPORT);
  if (m.layout.max_pass > 0) {
    if (m.max_draft_len + 1 > m.layout.max_pass)
      throw bundle_error(path + ": max_draft_len " + std::to_string(m.max_draft_len) + " needs verify passes of " +
                             std::to_string(m.max_draft_len + 1) + " tokens, more than the layout's max_pass " +
                             std::to_string(m.layout.max_pass),
                         REEXPORT);
    for (const auto& c : m.layout.caches)
      if (c.window && c.slots < ring_slots(c.window, m.layout.max_context, m.layout.max_pass, m.binding))
        throw bundle_error(path + ": layer " + std::to_string(c.layer) + "'s ring has " + std::to_string(c.slots) +
                               " slots, too few for window " + std::to_string(c.window) + " and passes of " +
                               std::to_string(m.layout.max_pass) + " tokens",
                           REEXPORT);
  }
  const GraphIO& target = m.graphs.at("target").io;  // with or without LOGIT_ROWS (ONNX bundles before 2026-12-05)
  check_aux(m, target, path);  // before the graphs' IO: an eagle3 target has an extra output
  same_io(path + ": target graph", target,
          target_io(m.layout, m.vocab_size, m.hidden_size, has_logit_rows(target), aux_size(target)));
  if (!m.drafter) {
    if (m.graphs.count("drafter"))
      throw bundle_error(path + ": a drafter graph is listed without a drafter entry", REEXPORT);
    return;
  }
  const DrafterEntry& d = *m.drafter;
  if (d.target_content_sha256 != m.target_content_sha256)  // either kind (eagle3 ones skipped it until 2026-12-07)
    throw bundle_error(path + ": the drafter was exported for target " + d.target_content_sha256.substr(0, 12) +
                           ", this bundle's target is " + m.target_content_sha256.substr(0, 12) +
                           " (a drafter from another target)",
                       "export the drafter together with its own target: edge-spec export --model M --drafter D");
  if (d.is_eagle3()) return verify_eagle3(m, path);
  for (const auto& share : d.kv_sharing) {
    const CacheSpec* spec = nullptr;
    for (const auto& c : m.layout.caches)
      if (c.layer == share.second) spec = &c;
    if (!spec || spec->kind != share.first)
      throw bundle_error(path + ": drafter kv_sharing " + share.first + " -> layer " + std::to_string(share.second) +
                             ", but the target has no cached " + share.first + " layer " + std::to_string(share.second),
                         "pair the drafter with the target it was trained for");
  }
  if (!m.graphs.count("drafter")) throw bundle_error(path + ": the drafter entry has no drafter graph", REEXPORT);
  GraphIO expected = drafter_io(m.layout, d.kv_sharing, m.vocab_size, m.hidden_size, d.candidates_per_step,
                                m.tables.count(contract::OUTPUT_TABLE) > 0, !fmt->constant_tables,
                                table_bits(m));
  same_io(path + ": drafter graph", m.graphs.at("drafter").io, expected);
}

}  // namespace

std::string TensorSpec::describe() const {
  std::string s = name + " " + dtype + "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    bool number = !shape[i].empty() && shape[i].find_first_not_of("0123456789") == std::string::npos;
    s += (i ? ", " : "") + (number ? shape[i] : "'" + shape[i] + "'");
  }
  return s + "]";
}

KVLayout layout_from_json(const Json& d) {
  KVLayout l;
  l.max_context = int(d.at("max_context").as_int());
  l.max_pass = d.get("max_pass").is_null() ? 0 : int(d.at("max_pass").as_int());
  l.binding = d.get("binding").is_null() ? BINDING_IO : d.at("binding").as_string();
  for (const auto& c : d.at("caches").as_array()) {
    CacheSpec s;
    s.layer = int(c.at("layer").as_int());
    s.kind = c.at("kind").as_string();
    s.num_kv_heads = int(c.at("num_kv_heads").as_int());
    s.head_dim = int(c.at("head_dim").as_int());
    s.slots = int(c.at("slots").as_int());
    s.window = c.at("window").is_null() ? 0 : int(c.at("window").as_int());
    l.caches.push_back(s);
  }
  return l;
}

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty() || a.back() == '/') return a + b;
  return a + "/" + b;
}

bool has_logit_rows(const GraphIO& io) {  // kv.has_logit_rows
  for (const auto& s : io.inputs)
    if (s.name == contract::LOGIT_ROWS) return true;
  return false;
}

bool DrafterEntry::is_eagle3() const { return kind == contract::DRAFTER_EAGLE3; }

int aux_size(const GraphIO& io) {  // kv.aux_size
  for (const auto& s : io.outputs)
    if (s.name == contract::AUX_HIDDEN && !s.shape.empty() &&
        s.shape.back().find_first_not_of("0123456789") == std::string::npos && !s.shape.back().empty())
      return std::stoi(s.shape.back());
  return 0;
}

GraphIO eagle3_drafter_io(const KVLayout& draft, int hidden, int draft_vocab,
                          const std::vector<TensorSpec>& tables) {  // kv.eagle3_drafter_io
  using namespace contract;
  const std::string h = std::to_string(hidden), s = slots_dim(DRAFT_KIND), vd = std::to_string(draft_vocab);
  GraphIO io;
  io.inputs = {spec(INPUT_IDS, "int64", {"1", T_DIM}), spec(HIDDEN, "float32", {"1", T_DIM, h}),
               spec(POSITION_IDS, "int64", {"1", T_DIM}),
               spec(DRAFT_MASK, "float32", {"1", "1", T_DIM, mask_cols_dim(DRAFT_KIND)})};
  const bool own = draft.binding == BINDING_IO;  // `state`: the program keeps the caches and writes the rows itself
  for (const auto& c : draft.caches)
    for (const std::string& n : {draft_k_cache_name(c.layer), draft_v_cache_name(c.layer)})
      if (own) io.inputs.push_back(spec(n, "float32", {"1", std::to_string(c.num_kv_heads), s, std::to_string(c.head_dim)}));
  for (const TensorSpec& t : tables) io.inputs.push_back(t);
  io.outputs = {spec(DRAFT_TOKEN_IDS, "int64", {vd}), spec(DRAFT_LOGITS, "float32", {vd}),
                spec(DRAFT_HIDDEN, "float32", {"1", "1", h})};
  for (const auto& c : draft.caches)
    for (const std::string& n : {draft_k_new_name(c.layer), draft_v_new_name(c.layer)})
      if (own)
        io.outputs.push_back(spec(n, "float32", {"1", std::to_string(c.num_kv_heads), T_DIM, std::to_string(c.head_dim)}));
  return io;
}

GraphIO eagle3_fc_io(int aux_width, int hidden) {  // kv.eagle3_fc_io
  using namespace contract;
  GraphIO io;
  io.inputs = {spec(AUX_HIDDEN, "float32", {"1", T_DIM, std::to_string(aux_width)})};
  io.outputs = {spec(FUSED_HIDDEN, "float32", {"1", T_DIM, std::to_string(hidden)})};
  return io;
}

GraphIO target_io(const KVLayout& layout, int vocab_size, int hidden_size, bool logit_rows, int aux_size) {
  using namespace contract;
  GraphIO io;
  const std::string r = logit_rows ? R_DIM : T_DIM;  // rows with logits
  io.inputs = {spec(INPUT_IDS, "int64", {"1", T_DIM}), spec(POSITION_IDS, "int64", {"1", T_DIM})};
  for (const auto& kind : layout.kinds())
    io.inputs.push_back(spec(mask_name(kind), "float32", {"1", "1", T_DIM, mask_cols_dim(kind)}));
  io.outputs = {spec(LOGITS, "float32", {"1", r, std::to_string(vocab_size)}),
                spec(HIDDEN, "float32", {"1", r, std::to_string(hidden_size)})};
  if (aux_size) io.outputs.push_back(spec(AUX_HIDDEN, "float32", {"1", T_DIM, std::to_string(aux_size)}));
  if (layout.binding == BINDING_IO || layout.binding == BINDING_SHARED) {
    for (const auto& c : layout.caches)
      for (const std::string& n : {k_cache_name(c.layer), v_cache_name(c.layer)})
        io.inputs.push_back(
            spec(n, "float32", {"1", std::to_string(c.num_kv_heads), slots_dim(c.kind), std::to_string(c.head_dim)}));
    const bool shared = layout.binding == BINDING_SHARED;  // the caches again (written in place), not new rows
    for (const auto& c : layout.caches)
      for (const std::string& n : shared ? std::vector<std::string>{k_present_name(c.layer), v_present_name(c.layer)}
                                         : std::vector<std::string>{k_new_name(c.layer), v_new_name(c.layer)})
        io.outputs.push_back(spec(n, "float32",
                                  {"1", std::to_string(c.num_kv_heads), shared ? slots_dim(c.kind) : std::string(T_DIM),
                                   std::to_string(c.head_dim)}));
  }
  if (logit_rows) io.inputs.push_back(spec(LOGIT_ROWS, "int64", {R_DIM}));
  return io;
}

int table_bits(const Manifest& m) {  // kv.table_bits
  if (m.tables.count(contract::EMBED_Q8)) return 8;
  if (m.tables.count(contract::EMBED_Q4)) return 4;
  return 0;
}

std::vector<TensorSpec> table_specs(int vocab_size, int hidden, int bits) {  // kv.table_specs
  using namespace contract;
  const std::string vocab = std::to_string(vocab_size);
  const int blocks = hidden / TABLE_BLOCK;
  const std::string scales = std::to_string(int64_t(vocab_size) * blocks);
  if (bits == 8)  // [V, Ht / 32, 32] uint8 codes, [V * Ht / 32] float32 scales
    return {spec(EMBED_Q8, "uint8", {vocab, std::to_string(blocks), std::to_string(TABLE_BLOCK)}),
            spec(EMBED_SCALES, "float32", {scales})};
  if (bits == 4)  // + [V * ceil(Ht / 64)] uint8 zero points, two codes per byte
    return {spec(EMBED_Q4, "uint8", {vocab, std::to_string(blocks), std::to_string(TABLE_BLOCK / 2)}),
            spec(EMBED_SCALES, "float32", {scales}),
            spec(EMBED_ZERO_POINTS, "uint8", {std::to_string(int64_t(vocab_size) * ((blocks + 1) / 2))})};
  return {spec(EMBED_TABLE, "float32", {vocab, std::to_string(hidden)})};
}

GraphIO drafter_io(const KVLayout& layout, const std::map<std::string, int>& sources, int vocab_size,
                   int target_hidden, int candidates, bool output_table, bool tables, int table_bits) {
  using namespace contract;
  GraphIO io;
  io.inputs = {spec(INPUT_IDS, "int64", {"1", "1"}),
               spec(HIDDEN, "float32", {"1", "1", std::to_string(target_hidden)}),
               spec(POSITION_IDS, "int64", {"1", "1"})};
  for (const auto& s : sources)  // std::map: sorted by kind, as edge_spec.contract.kv sorts them
    io.inputs.push_back(spec(mask_name(s.first), "float32", {"1", "1", "1", slots_dim(s.first)}));
  if (layout.binding == BINDING_IO || layout.binding == BINDING_SHARED) {
    for (const auto& s : sources)
      for (const auto& c : layout.caches)
        if (c.layer == s.second)
          for (const std::string& n : {k_cache_name(c.layer), v_cache_name(c.layer)})
            io.inputs.push_back(spec(n, "float32", {"1", std::to_string(c.num_kv_heads), slots_dim(c.kind),
                                                    std::to_string(c.head_dim)}));
    if (tables)
      for (const TensorSpec& t : table_specs(vocab_size, target_hidden, table_bits)) io.inputs.push_back(t);
    if (tables && !table_bits && output_table)
      io.inputs.push_back(spec(OUTPUT_TABLE, "float32", {std::to_string(vocab_size), std::to_string(target_hidden)}));
  }
  io.outputs = {spec(DRAFT_TOKEN_IDS, "int64", {std::to_string(candidates)}),
                spec(DRAFT_LOGITS, "float32", {std::to_string(candidates)}),
                spec(DRAFT_HIDDEN, "float32", {"1", "1", std::to_string(target_hidden)})};
  return io;
}

Manifest read_manifest(const std::string& folder, bool verify_checksums) {
  if (is_file(folder)) {
    const size_t slash = folder.find_last_of('/');
    const std::string name = slash == std::string::npos ? folder : folder.substr(slash + 1);
    const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : folder.substr(0, slash);
    throw bundle_error(folder + " is a file, not a bundle folder",
                       name == MANIFEST_FILE ? "pass the folder that holds it: --bundle " + parent
                                             : std::string("pass the --out folder of `edge-spec export`"));
  }
  if (!is_dir(folder))
    throw bundle_error("bundle folder " + folder + " does not exist", "pass the --out folder of `edge-spec export`");
  const std::string path = join_path(folder, MANIFEST_FILE);
  if (!is_file(path))
    throw bundle_error(path + " is missing: " + folder + " is not a bundle (or its export was interrupted)", REEXPORT);
  Json raw;
  try {
    raw = Json::parse(read_text(path));
  } catch (const JsonError& err) {
    throw bundle_error(path + " is not valid JSON (" + err.what() + ")", REEXPORT);
  }
  const Json& version = raw.get("schema_version");
  if (!version.is_number() || (version.as_number() != 1 && version.as_number() != 2))
    throw bundle_error(path + ": schema_version " + version.dump() + ", this edge-spec reads versions 1, 2",
                       "re-export the bundle with this edge-spec version (or install the version that wrote it)");
  check_fields(raw, path);  // every field from_json reads, by type and range (manifest_check.h)
  Manifest m;
  try {
    m = from_json(raw);
  } catch (const JsonError& err) {
    throw bundle_error(path + ": missing or malformed field (" + err.what() + ")", REEXPORT);
  }
  verify_files(folder, m, verify_checksums);
  check_tables(m, path);
  check_memory(m, path);  // before anything allocates the caches
  verify_contract(m, path);
  return m;
}

}  // namespace es
