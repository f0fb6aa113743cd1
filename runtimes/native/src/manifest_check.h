// manifest_check.h - every manifest field the runner reads, by type and range, and the memory a bundle will take,
// before anything is allocated: the C++ side of edge_spec/contract/manifest_check.py (same fields, same wording).
//
// A hand-edited or damaged manifest.json is not covered by the checksums (they cover the files it lists), so
// read_manifest runs these around from_json: check_fields on the raw JSON (integers are integers in range, lists are
// lists, token ids lie inside the vocabulary, each KV cache's slots fit max_context), then check_tables (a table's
// shape x dtype == its file's bytes) and check_memory (the KV cache + tables against the memory this machine has).
// Every refusal is an Error(Code::Bundle) "<manifest.json>: <field> is <value>, not <what>" with the fix.
#pragma once

#include <cstdint>
#include <string>

#include "json.h"
#include "manifest.h"

namespace es {

// The raw document's fields (path: the manifest file, for the messages).
void check_fields(const Json& raw, const std::string& path);

// Each table's dtype x shape against the byte count the manifest records for its file (verify_files has checked
// that against the disk); embed_table / output_table are [vocab_size, hidden_size].
void check_tables(const Manifest& m, const std::string& path);

// Bytes the target's KV cache takes (keys and values, fp32; the layout's slots), and the tables' bytes.
double kv_cache_bytes(const KVLayout& layout);
double table_bytes(const Manifest& m);

// Bytes this process can still take: MemAvailable (/proc/meminfo) on Linux, else the physical memory
// (sysconf(_SC_PHYS_PAGES) x page size); 0 when unknown (then nothing is refused).
uint64_t available_memory();

// Refuses a bundle whose KV cache + tables would not fit `available` (0: available_memory()), naming max_context.
void check_memory(const Manifest& m, const std::string& path, uint64_t available = 0);

}  // namespace es
