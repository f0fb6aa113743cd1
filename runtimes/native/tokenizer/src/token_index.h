// token_index.h - token text -> id over a vector of token texts indexed by id: one flat open-addressing
// table (FNV-1a hashes, linear probing), so that loading a 262k vocabulary and resolving 515k merges
// touches little memory per lookup.

#ifndef ES_TOKENIZER_TOKEN_INDEX_H
#define ES_TOKENIZER_TOKEN_INDEX_H

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace es {

class TokenIndex {
 public:
  // Indexes tokens[id] for every id where present[id]; returns the id of a text found twice, or -1.
  int32_t build(const std::vector<std::string>& tokens, const std::vector<unsigned char>& present);
  int32_t find(std::string_view text) const;  // -1 when absent

 private:
  static uint32_t hash(std::string_view text);
  const std::vector<std::string>* tokens_ = nullptr;
  std::vector<int32_t> ids_;       // -1: empty slot
  std::vector<uint32_t> hashes_;   // beside the ids, to skip most string compares
  uint32_t mask_ = 0;
};

}  // namespace es

#endif  // ES_TOKENIZER_TOKEN_INDEX_H
