// impl.h - what a loaded Tokenizer holds (shared by load.cpp and tokenizer.cpp).

#ifndef ES_TOKENIZER_IMPL_H
#define ES_TOKENIZER_IMPL_H

#include <string>
#include <unordered_map>
#include <vector>

#include "components.h"
#include "es_tokenizer.h"

namespace es {

struct Tokenizer::Impl {
  std::string origin;  // the tokenizer.json path, for messages
  std::string family;  // "byte_level_bpe" or "sentencepiece_bpe"
  AddedTokens added;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Bpe model;
  Decoder decoder;

  std::vector<std::string> id_to_token;             // by id (model vocab, then added tokens over it)
  std::vector<unsigned char> present, special;      // per id
  std::unordered_map<std::string, int32_t> added_ids;

  int32_t bos_id = -1, eos_id = -1;
  bool add_bos_token = false;

  void check_id(int32_t id, const char* where) const;
};

}  // namespace es

#endif  // ES_TOKENIZER_IMPL_H
