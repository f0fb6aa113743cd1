// manifest.h - bundle/manifest.json read and verified, as edge_spec/contract/manifest.py's read_manifest does: schema,
// every file's size and sha256, the graph IO vs the KV contract, and the drafter/target pairing. Every refusal is
// an Error(Code::Bundle) naming the file (or field) and the fix.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "json.h"
#include "kv.h"

namespace es {

struct TensorSpec {
  std::string name;
  std::string dtype;               // "int64" | "float32"
  std::vector<std::string> shape;  // ints as decimal text, or symbolic dim names ("T", "S_full", "S_full+T")
  bool operator==(const TensorSpec& o) const { return name == o.name && dtype == o.dtype && shape == o.shape; }
  std::string describe() const;    // "input_ids int64[1, 'T']" (Python's repr of the shape list)
};

struct GraphIO {
  std::vector<TensorSpec> inputs, outputs;
};

struct GraphEntry {
  std::string file;  // relative to the bundle root
  std::string precision;
  GraphIO io;
  std::string method;  // the entry point inside `file` (ExecuTorch method); "" for the file itself
  std::string data;    // a file the entry point reads its weights from (an ExecuTorch .ptd); "": `file` holds them
};

// The drafter kinds (edge_spec/contract/manifest.py MTP, EAGLE3; contract_names.h): contract::DRAFTER_MTP reads the
// target's caches; contract::DRAFTER_EAGLE3 reads the target's aux states (AUX_HIDDEN) and keeps its own cache (onnx
// bundles: ort_backend.cpp).
struct DrafterEntry {
  std::string kind = contract::DRAFTER_MTP;  // the JSON's "kind" (absent: MTP)
  std::string name;
  std::string content_sha256;
  std::string target_content_sha256;
  std::map<std::string, int> kv_sharing;  // kind -> target layer whose cache it reads
  std::string head_from;
  int candidates_per_step = 0;
  // eagle3 only (absent for MTP): the target layers whose residual streams it reads (AUX_HIDDEN), its candidates per
  // step (Vd), and its own cache layout (kind contract::DRAFT_KIND, `io` binding; absent or malformed: not set)
  std::vector<int> aux_layers;
  int draft_vocab_size = 0;
  std::optional<KVLayout> draft_kv;
  bool is_eagle3() const;
};

struct FileEntry {
  std::string sha256;
  int64_t bytes = 0;
};

struct Manifest {
  int schema_version = 0;
  std::string format, precision, created_by;
  std::string target_name, target_content_sha256;
  std::optional<DrafterEntry> drafter;
  KVLayout layout;
  std::string binding;
  int vocab_size = 0, hidden_size = 0;
  double embed_scale = 1.0;
  int bos_token_id = -1;  // -1: none
  std::vector<int> eos_token_ids;
  std::string chat_template;                 // "" when none
  std::vector<std::string> tokenizer_files;  // relative paths
  int max_draft_len = 0;
  std::map<std::string, GraphEntry> graphs;  // "target", "drafter"
  std::map<std::string, std::string> tables; // name -> file
  std::map<std::string, FileEntry> files;    // relative path -> sha256 + size
  Json raw;                                  // the whole document (for fields the runner does not model)

  int max_context() const { return layout.max_context; }
};

constexpr const char* MANIFEST_FILE = "manifest.json";

// folder: the bundle root. Throws Error(Code::Bundle) naming the file and the fix.
Manifest read_manifest(const std::string& folder, bool verify_checksums = true);

// The KV contract's IO tables (edge_spec/contract/kv.py target_io / drafter_io), for the check and for the backends.
// aux_size (n * Ht; 0: none): the target also returns AUX_HIDDEN [1, T, aux_size] after HIDDEN (eagle3 drafters).
GraphIO target_io(const KVLayout& layout, int vocab_size, int hidden_size, bool logit_rows = false, int aux_size = 0);
bool has_logit_rows(const GraphIO& io);  // a target graph taking LOGIT_ROWS returns logits / hidden of those rows
int aux_size(const GraphIO& io);         // kv.aux_size: the width of the target's AUX_HIDDEN output (0: none)
// kv.eagle3_drafter_io / kv.eagle3_fc_io: an eagle3 drafter's step graph over its own cache layout `draft`, its fc graph
// tables: the shared embedding's specs when the step graph gathers the target's table (table_specs), else none
GraphIO eagle3_drafter_io(const KVLayout& draft, int hidden, int draft_vocab, const std::vector<TensorSpec>& tables = {});
GraphIO eagle3_fc_io(int aux_width, int hidden);
// table_bits: the shared table's quantized form, 8 or 4 (0: float32; kv.table_specs)
GraphIO drafter_io(const KVLayout& layout, const std::map<std::string, int>& sources, int vocab_size,
                   int target_hidden, int candidates, bool output_table, bool tables, int table_bits = 0);
int table_bits(const Manifest& m);  // 8 (embed_table_q8), 4 (embed_table_q4) or 0, from the manifest's tables
std::vector<TensorSpec> table_specs(int vocab_size, int hidden, int bits);  // kv.table_specs: the shared table's inputs

KVLayout layout_from_json(const Json& layout);  // the manifest's kv.layout (edge_spec.contract.kv.KVLayout.to_json)

std::string join_path(const std::string& a, const std::string& b);

}  // namespace es
