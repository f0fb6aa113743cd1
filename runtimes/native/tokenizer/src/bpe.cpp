// bpe.cpp - the BPE model: a word's characters (or their <0xNN> byte tokens) merged pair by pair,
// always the pair of lowest merge rank first (leftmost among equals), as tokenizers' Word::merge_all.

#include <cstdio>
#include <queue>

#include "components.h"
#include "es_tokenizer.h"
#include "utf8.h"

namespace es {

void Bpe::load(std::vector<std::string> tokens, std::vector<unsigned char> present,
               const std::vector<std::pair<std::string, std::string>>& merges, const json::Value& options,
               const std::string& origin) {
  auto option = [&](const char* key) -> const json::Value* {
    const json::Value* value = options.find(key);
    return value && !value->is_null() ? value : nullptr;
  };
  if (const json::Value* dropout = option("dropout"))
    if (!(dropout->type == json::Type::Number && (dropout->number == 0.0 || dropout->number == 1.0)))
      unsupported(origin, "model BPE", "with dropout", "dropout null");
  if (option("continuing_subword_prefix"))
    unsupported(origin, "model BPE", "with continuing_subword_prefix", "no subword prefix");
  if (option("end_of_word_suffix")) unsupported(origin, "model BPE", "with end_of_word_suffix", "no word suffix");

  tokens_ = std::move(tokens);
  present_ = std::move(present);
  int32_t twice = index_.build(tokens_, present_);
  if (twice >= 0)
    throw TokenizerError(origin + ": the vocabulary lists \"" + tokens_[size_t(twice)] +
                         "\" twice (the file is damaged; re-export it)");
  auto flag = [&](const char* key) {
    const json::Value* value = option(key);
    return value && value->type == json::Type::Bool && value->boolean;
  };
  fuse_unk_ = flag("fuse_unk");
  byte_fallback_ = flag("byte_fallback");
  ignore_merges_ = flag("ignore_merges");
  if (const json::Value* unk = option("unk_token")) {
    unk_id_ = unk->type == json::Type::String ? find(unk->string) : -1;
    if (unk_id_ < 0)
      throw TokenizerError(origin + ": the BPE unk_token is not in the vocabulary (the file is damaged; re-export it)");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_ids_[b] = find(name);
  }

  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  merges_.assign(capacity, Merge());
  merge_mask_ = capacity - 1;
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& merge = merges[rank];
    joined.assign(merge.first).append(merge.second);
    int32_t a = find(merge.first), b = find(merge.second), ab = find(joined);
    if (a < 0 || b < 0 || ab < 0)
      throw TokenizerError(origin + ": merge #" + std::to_string(rank) + " (\"" + merge.first + "\" \"" + merge.second +
                           "\") uses a token missing from the vocabulary (the file is damaged; re-export it)");
    add_merge(a, b, uint32_t(rank), ab);
  }
}

static uint64_t mix(uint64_t key) {  // splitmix64's finalizer: spreads both ids over the table
  key = (key ^ (key >> 30)) * 0xBF58476D1CE4E5B9ull;
  key = (key ^ (key >> 27)) * 0x94D049BB133111EBull;
  return key ^ (key >> 31);
}

void Bpe::add_merge(int32_t a, int32_t b, uint32_t rank, int32_t id) {
  uint64_t k = key(a, b);
  uint64_t slot = mix(k) & merge_mask_;
  while (merges_[slot].key != kEmpty && merges_[slot].key != k) slot = (slot + 1) & merge_mask_;
  merges_[slot] = Merge{k, rank, id};  // a repeated pair: the last one wins, as in tokenizers
}

const Bpe::Merge* Bpe::find_merge(int32_t a, int32_t b) const {
  if (merges_.empty()) return nullptr;
  uint64_t k = key(a, b);
  for (uint64_t slot = mix(k) & merge_mask_; merges_[slot].key != kEmpty; slot = (slot + 1) & merge_mask_)
    if (merges_[slot].key == k) return &merges_[slot];
  return nullptr;
}

void Bpe::initial_symbols(const std::string& word, std::vector<int32_t>& symbols) const {
  bool previous_unk = false;
  size_t pos = 0;
  while (pos < word.size()) {
    size_t length = utf8::valid_sequence_length(word, pos);
    if (length == 0) length = 1;  // not reached: the text was validated before
    std::string_view ch(word.data() + pos, length);
    pos += length;
    int32_t id = find(ch);
    if (id >= 0) {
      symbols.push_back(id);
      previous_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) symbols.push_back(byte_ids_[b]);
        previous_unk = false;
        continue;
      }
    }
    if (unk_id_ < 0) continue;  // tokenizers drops characters it cannot represent when there is no unk token
    if (!(fuse_unk_ && previous_unk)) symbols.push_back(unk_id_);
    previous_unk = true;
  }
}

void Bpe::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    int32_t id = find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<int32_t> ids;
  initial_symbols(word, ids);
  size_t n = ids.size();
  if (n < 2) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  // a doubly linked list over the symbols; merged-away symbols are marked dead
  std::vector<int> prev(n), next(n);
  std::vector<bool> dead(n, false);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = int(i) - 1;
    next[i] = i + 1 < n ? int(i + 1) : -1;
  }
  struct Candidate {
    uint32_t rank;
    int pos;
    int32_t id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto offer = [&](int left) {
    int right = next[left];
    if (right < 0) return;
    const Merge* merge = find_merge(ids[left], ids[right]);
    if (merge) queue.push({merge->rank, left, merge->id});
  };
  for (size_t i = 0; i + 1 < n; ++i) offer(int(i));
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    if (dead[top.pos] || next[top.pos] < 0) continue;
    int right = next[top.pos];
    const Merge* merge = find_merge(ids[top.pos], ids[right]);
    if (merge == nullptr || merge->id != top.id) continue;  // a stale entry
    ids[top.pos] = top.id;
    dead[right] = true;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) offer(prev[top.pos]);
    offer(top.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace es
