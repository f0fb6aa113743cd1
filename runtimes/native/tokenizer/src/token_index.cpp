// token_index.cpp - see token_index.h.

#include "token_index.h"

namespace es {

uint32_t TokenIndex::hash(std::string_view text) {
  uint32_t h = 2166136261u;
  for (unsigned char c : text) h = (h ^ c) * 16777619u;
  return h;
}

int32_t TokenIndex::build(const std::vector<std::string>& tokens, const std::vector<unsigned char>& present) {
  tokens_ = &tokens;
  size_t capacity = 16;
  while (capacity < tokens.size() * 2) capacity *= 2;  // load factor <= 0.5
  mask_ = uint32_t(capacity - 1);
  ids_.assign(capacity, -1);
  hashes_.assign(capacity, 0);
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!present[id]) continue;
    uint32_t h = hash(tokens[id]);
    uint32_t slot = h & mask_;
    while (ids_[slot] >= 0) {
      if (hashes_[slot] == h && tokens[size_t(ids_[slot])] == tokens[id]) return int32_t(id);
      slot = (slot + 1) & mask_;
    }
    ids_[slot] = int32_t(id);
    hashes_[slot] = h;
  }
  return -1;
}

int32_t TokenIndex::find(std::string_view text) const {
  if (tokens_ == nullptr) return -1;
  uint32_t h = hash(text);
  for (uint32_t slot = h & mask_; ids_[slot] >= 0; slot = (slot + 1) & mask_)
    if (hashes_[slot] == h && (*tokens_)[size_t(ids_[slot])] == text) return ids_[slot];
  return -1;
}

}  // namespace es
