// manifest_check.cpp - see manifest_check.h. Mirrors edge_spec/contract/manifest_check.py, plus the fields only the
// C++ reader reads (graph IO, files, the drafter entry, each cache's recorded shape).
#include "manifest_check.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "contract_names.h"
#include "errors.h"

namespace es {

namespace {

const char* const FIX = "re-run `edge-spec export` into a fresh --out folder (manifest.json was edited or damaged)";
constexpr int64_t I32 = 2147483647;            // the largest count the runner and the graphs' int indices take
constexpr int64_t EXACT = 9007199254740992;    // 2^53: the largest integer a JSON number holds exactly
const std::vector<std::string> TABLE_DTYPES = {"float32", "float16", "int8", "uint8"};

// Refusals name the field by its path in the document ("tokenizer.eos_token_ids[0]").
class Fields {
 public:
  explicit Fields(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& what, const Json* v, const std::string& want) const {
    std::string text = v ? v->dump() : "missing";
    if (text.size() > 60) text = text.substr(0, 57) + "...";
    throw bundle_error(path_ + ": " + what + " is " + text + ", not " + want, FIX);
  }
  [[noreturn]] void fail(const std::string& message) const { throw bundle_error(path_ + ": " + message, FIX); }

  const Json* member(const Json& obj, const std::string& key) const { return obj.has(key) ? &obj.at(key) : nullptr; }

  int64_t integer(const Json* v, const std::string& what, int64_t lo, int64_t hi) const {
    const std::string want = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (!v || !v->is_number()) fail(what, v, want);
    const double x = v->as_number();
    if (!(std::floor(x) == x && x >= double(lo) && x <= double(hi))) fail(what, v, want);
    return int64_t(x);
  }
  int64_t integer(const Json& obj, const std::string& key, const std::string& what, int64_t lo, int64_t hi) const {
    return integer(member(obj, key), what, lo, hi);
  }
  // null or absent: fine (returns -1)
  int64_t optional_integer(const Json& obj, const std::string& key, const std::string& what, int64_t lo,
                           int64_t hi) const {
    const Json* v = member(obj, key);
    return (!v || v->is_null()) ? -1 : integer(v, what, lo, hi);
  }
  const Json& object(const Json& obj, const std::string& key, const std::string& what) const {
    const Json* v = member(obj, key);
    if (!v || !v->is_object()) fail(what, v, "an object");
    return *v;
  }
  const Json& array(const Json& obj, const std::string& key, const std::string& what, const std::string& want) const {
    const Json* v = member(obj, key);
    if (!v || !v->is_array()) fail(what, v, want);
    return *v;
  }
  void string(const Json& obj, const std::string& key, const std::string& what, bool nullable = false) const {
    const Json* v = member(obj, key);
    if (nullable && (!v || v->is_null())) return;
    if (!v || !v->is_string()) fail(what, v, nullable ? "a string or null" : "a string");
  }

 private:
  const std::string& path_;
};

void check_graph(const Fields& f, const Json& g, const std::string& at) {
  f.string(g, "file", at + ".file");
  f.string(g, "precision", at + ".precision");
  f.string(g, "method", at + ".method", /*nullable=*/true);
  f.string(g, "data", at + ".data", /*nullable=*/true);
  for (const char* role : {"inputs", "outputs"}) {
    const std::string list = at + "." + role;
    const auto& specs = f.array(g, role, list, "a list of tensors").as_array();
    for (size_t i = 0; i < specs.size(); ++i) {
      const std::string t = list + "[" + std::to_string(i) + "]";
      if (!specs[i].is_object()) f.fail(t, &specs[i], "an object {name, dtype, shape}");
      f.string(specs[i], "name", t + ".name");
      f.string(specs[i], "dtype", t + ".dtype");
      const auto& dims = f.array(specs[i], "shape", t + ".shape", "a list of dims").as_array();
      for (size_t j = 0; j < dims.size(); ++j)
        if (!dims[j].is_string()) f.integer(&dims[j], t + ".shape[" + std::to_string(j) + "]", 0, I32);
    }
  }
}

void check_layout(const Fields& f, const Json& kv, int64_t max_context) {
  f.string(kv, "binding", "kv.binding");
  const Json& layout = f.object(kv, "layout", "kv.layout");
  const Json* lc = f.member(layout, "max_context");
  if (!lc || !lc->is_number() || lc->as_number() != double(max_context))
    f.fail("kv.layout.max_context " + (lc ? lc->dump() : std::string("missing")) + " differs from max_context " +
           std::to_string(max_context));
  f.optional_integer(layout, "max_pass", "kv.layout.max_pass", 1, I32);
  f.string(layout, "binding", "kv.layout.binding", /*nullable=*/true);
  const auto& caches = f.array(layout, "caches", "kv.layout.caches", "a list of caches").as_array();
  for (size_t i = 0; i < caches.size(); ++i) {
    const std::string at = "kv.layout.caches[" + std::to_string(i) + "]";
    const Json& c = caches[i];
    if (!c.is_object()) f.fail(at, &c, "an object");
    f.integer(c, "layer", at + ".layer", 0, I32);
    const Json* kind = f.member(c, "kind");
    if (!kind || !kind->is_string() || (kind->as_string() != "full" && kind->as_string() != "sliding"))
      f.fail(at + ".kind", kind, "\"full\" or \"sliding\"");
    const int64_t heads = f.integer(c, "num_kv_heads", at + ".num_kv_heads", 1, I32);
    const int64_t dim = f.integer(c, "head_dim", at + ".head_dim", 1, I32);
    const int64_t slots = f.integer(c, "slots", at + ".slots", 1, I32);
    if (!f.member(c, "window")) f.fail(at + ".window", nullptr, "an integer >= 1 or null");
    f.optional_integer(c, "window", at + ".window", 1, I32);
    if (slots > max_context)
      f.fail(at + " has " + std::to_string(slots) + " slots, more than max_context " + std::to_string(max_context));
    const Json* shape = f.member(c, "shape");  // recorded beside the fields it follows from: [1, H, S, D]
    if (shape && !shape->is_null()) {
      const std::string want = "[1, " + std::to_string(heads) + ", " + std::to_string(slots) + ", " +
                               std::to_string(dim) + "] (1, num_kv_heads, slots, head_dim)";
      bool same = shape->is_array() && shape->as_array().size() == 4;
      const int64_t expect[4] = {1, heads, slots, dim};
      for (size_t j = 0; same && j < 4; ++j)
        same = shape->as_array()[j].is_number() && shape->as_array()[j].as_number() == double(expect[j]);
      if (!same) f.fail(at + ".shape", shape, want);
    }
  }
}

void check_drafter(const Fields& f, const Json& d) {
  if (!d.is_object()) f.fail("drafter", &d, "an object or null");
  f.string(d, "name", "drafter.name");
  f.string(d, "content_sha256", "drafter.content_sha256");
  f.string(d, "target_content_sha256", "drafter.target_content_sha256", /*nullable=*/true);
  f.string(d, "head_from", "drafter.head_from", /*nullable=*/true);
  f.optional_integer(d, "candidates_per_step", "drafter.candidates_per_step", 1, I32);
  f.string(d, "kind", "drafter.kind", /*nullable=*/true);  // eagle3 drafters' fields (absent for MTP ones)
  f.optional_integer(d, "draft_vocab_size", "drafter.draft_vocab_size", 0, I32);
  const Json* aux = f.member(d, "aux_layers");
  if (aux && !aux->is_null()) {
    if (!aux->is_array()) f.fail("drafter.aux_layers", aux, "a list of layer ids");
    for (size_t i = 0; i < aux->as_array().size(); ++i)
      f.integer(&aux->as_array()[i], "drafter.aux_layers[" + std::to_string(i) + "]", 0, I32);
  }
  const Json* draft_kv = f.member(d, "draft_kv");
  if (draft_kv && !draft_kv->is_null() && !draft_kv->is_object())
    f.fail("drafter.draft_kv", draft_kv, "a KV layout object or null");
  const Json* sharing = f.member(d, "kv_sharing");
  if (sharing && !sharing->is_null()) {
    if (!sharing->is_object()) f.fail("drafter.kv_sharing", sharing, "an object {kind: layer}");
    for (const auto& kv : sharing->as_object()) f.integer(&kv.second, "drafter.kv_sharing." + kv.first, 0, I32);
  }
}

size_t itemsize(const std::string& dtype) { return dtype == "float32" ? 4 : dtype == "float16" ? 2 : 1; }

std::string shape_text(const std::vector<Json>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i].dump();
  return s + "]";
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1ULL << 30));
  return buf;
}

}  // namespace

void check_fields(const Json& raw, const std::string& path) {
  const Fields f(path);
  if (!raw.is_object()) f.fail("the document", &raw, "a JSON object");
  f.string(raw, "format", "format");
  f.string(raw, "precision", "precision");
  f.string(raw, "created_by", "created_by", /*nullable=*/true);
  const Json& target = f.object(raw, "target", "target");
  f.string(target, "name", "target.name");
  f.string(target, "content_sha256", "target.content_sha256");
  const Json* drafter = f.member(raw, "drafter");
  if (drafter && !drafter->is_null()) check_drafter(f, *drafter);
  const int64_t vocab = f.integer(raw, "vocab_size", "vocab_size", 1, I32);
  f.integer(raw, "hidden_size", "hidden_size", 1, I32);
  const int64_t max_context = f.integer(raw, "max_context", "max_context", 2, I32);
  f.integer(raw, "max_draft_len", "max_draft_len", 0, 1024);
  const Json* scale = f.member(raw, "embed_scale");
  if (!scale || !scale->is_number() || !std::isfinite(scale->as_number()) || scale->as_number() <= 0)
    f.fail("embed_scale", scale, "a finite number > 0");
  const Json& tok = f.object(raw, "tokenizer", "tokenizer");
  const auto& eos = f.array(tok, "eos_token_ids", "tokenizer.eos_token_ids", "a list of token ids").as_array();
  for (size_t i = 0; i < eos.size(); ++i)
    f.integer(&eos[i], "tokenizer.eos_token_ids[" + std::to_string(i) + "]", 0, vocab - 1);
  for (const char* name : {"bos_token_id", "pad_token_id"})
    f.optional_integer(tok, name, std::string("tokenizer.") + name, 0, vocab - 1);
  if (!f.member(tok, "bos_token_id")) f.fail("tokenizer.bos_token_id", nullptr, "a token id or null");
  if (!f.member(tok, "chat_template")) f.fail("tokenizer.chat_template", nullptr, "a string or null");
  f.string(tok, "chat_template", "tokenizer.chat_template", /*nullable=*/true);
  const auto& files = f.array(tok, "files", "tokenizer.files", "a list of file names").as_array();
  for (size_t i = 0; i < files.size(); ++i)
    if (!files[i].is_string()) f.fail("tokenizer.files[" + std::to_string(i) + "]", &files[i], "a file name");
  check_layout(f, f.object(raw, "kv", "kv"), max_context);
  for (const auto& g : f.object(raw, "graphs", "graphs").as_object()) {
    if (!g.second.is_object()) f.fail("graphs." + g.first, &g.second, "an object");
    check_graph(f, g.second, "graphs." + g.first);
  }
  for (const auto& t : f.object(raw, "tables", "tables").as_object()) {
    const std::string at = "tables." + t.first;
    const Json& e = t.second;
    const Json* dtype = e.is_object() ? f.member(e, "dtype") : nullptr;
    bool known = dtype && dtype->is_string();
    if (known) {
      known = false;
      for (const auto& d : TABLE_DTYPES) known = known || d == dtype->as_string();
    }
    if (!known || !e.get("shape").is_array())
      f.fail(at + " needs a dtype (float32, float16, int8, uint8) and a shape list");
    f.string(e, "file", at + ".file");
    const auto& dims = e.at("shape").as_array();
    for (size_t j = 0; j < dims.size(); ++j) f.integer(&dims[j], at + ".shape[" + std::to_string(j) + "]", 1, I32);
  }
  for (const auto& e : f.object(raw, "files", "files").as_object()) {
    const std::string at = "files[\"" + e.first + "\"]";
    if (!e.second.is_object() || !e.second.has("sha256") || !e.second.has("bytes"))
      f.fail("file entry '" + e.first + "' lacks sha256/bytes");
    f.string(e.second, "sha256", at + ".sha256");
    f.integer(e.second, "bytes", at + ".bytes", 0, EXACT);
  }
}

void check_tables(const Manifest& m, const std::string& path) {
  const Fields f(path);
  for (const auto& t : m.raw.at("tables").as_object()) {
    const std::string dtype = t.second.at("dtype").as_string();
    const auto& dims = t.second.at("shape").as_array();
    double want = double(itemsize(dtype));
    for (const auto& d : dims) want *= d.as_number();
    const std::string& file = t.second.at("file").as_string();
    auto it = m.files.find(file);
    const std::string holds = it == m.files.end() ? "no file entry" : std::to_string(it->second.bytes) + " bytes";
    if (it == m.files.end() || double(it->second.bytes) != want) {
      char bytes[32];
      std::snprintf(bytes, sizeof bytes, "%.0f", want);
      f.fail("tables." + t.first + " is " + dtype + shape_text(dims) + " (" + bytes + " bytes), but " + file +
             " holds " + holds);
    }
    if ((t.first == contract::EMBED_TABLE || t.first == contract::OUTPUT_TABLE) &&
        (dims.size() != 2 || dims[0].as_int() != m.vocab_size || dims[1].as_int() != m.hidden_size))
      f.fail("tables." + t.first + ".shape is " + shape_text(dims) + ", not [vocab_size, hidden_size] = [" +
             std::to_string(m.vocab_size) + ", " + std::to_string(m.hidden_size) + "]");
  }
}

double kv_cache_bytes(const KVLayout& layout) {
  double total = 0;
  for (const auto& c : layout.caches) total += 2.0 * c.num_kv_heads * double(c.slots) * c.head_dim * 4.0;
  return total;
}

double table_bytes(const Manifest& m) {
  double total = 0;
  for (const auto& t : m.tables) {
    auto it = m.files.find(t.second);
    if (it != m.files.end()) total += double(it->second.bytes);
  }
  return total;
}

uint64_t available_memory() {
#ifdef __linux__
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.compare(0, 13, "MemAvailable:") != 0) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kb = 0;
    if (fields >> kb) return kb * 1024;
  }
#endif
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return uint64_t(pages) * uint64_t(page);
#endif
  return 0;
}

void check_memory(const Manifest& m, const std::string& path, uint64_t available) {
  const uint64_t have = available ? available : available_memory();
  // an eagle3 drafter's own cache too (manifest_check.py check_memory's `drafter`): max_context + 1 slots a layer
  const bool own = m.drafter && m.drafter->draft_kv;
  const double kv = kv_cache_bytes(m.layout) + (own ? kv_cache_bytes(*m.drafter->draft_kv) : 0.0);
  const double tables = table_bytes(m);
  if (have == 0 || kv + tables <= double(have)) return;
  throw bundle_error(path + ": max_context " + std::to_string(m.max_context()) + " needs a KV cache of " + gib(kv) +
                         (own ? " (the drafter's own included)" : "") +
                         (tables > 0 ? " and " + gib(tables) + " of tables" : std::string()) +
                         ", more than this machine's " + gib(double(have)) + " available",
                     "re-export the bundle with a smaller --max-context (edge-spec export ... --max-context N), or "
                     "restore manifest.json if it was edited");
}

}  // namespace es
