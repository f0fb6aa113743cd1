// added_tokens.cpp - the tokenizer.json "added_tokens": kept whole, matched before the model runs.
// Tokens with "normalized": false are found in the raw text; those with true in the normalized text
// (with their own text normalized). Among matches the leftmost wins, then the longest.

#include "components.h"
#include "es_tokenizer.h"

namespace es {

void AddedTokens::Trie::insert(const std::string& text, int32_t id) {
  int32_t node = 0;
  for (unsigned char b : text) {
    auto it = nodes[node].next.find(b);
    if (it == nodes[node].next.end()) {
      nodes.emplace_back();
      int32_t child = int32_t(nodes.size() - 1);
      nodes[node].next.emplace(b, child);
      node = child;
    } else {
      node = it->second;
    }
  }
  if (nodes[node].id < 0) nodes[node].id = id;
}

size_t AddedTokens::Trie::longest_at(const std::string& text, size_t pos, int32_t& id) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = nodes[node].next.find(static_cast<unsigned char>(text[i]));
    if (it == nodes[node].next.end()) break;
    node = it->second;
    if (nodes[node].id >= 0) {
      best = i + 1 - pos;
      id = nodes[node].id;
    }
  }
  return best;
}

void AddedTokens::load(const json::Value& list, const std::string& origin) {
  if (list.is_null()) return;
  if (list.type != json::Type::Array) throw TokenizerError(origin + ": \"added_tokens\" is not an array");
  for (const json::Value& item : list.array) {
    const json::Value* id = item.find("id");
    const json::Value* content = item.find("content");
    if (!id || id->type != json::Type::Number || !content || content->type != json::Type::String || id->number < 0)
      throw TokenizerError(origin + ": an added token lacks a numeric \"id\" or a \"content\" string");
    auto flag = [&](const char* key) {
      const json::Value* value = item.find(key);
      return value && value->type == json::Type::Bool && value->boolean;
    };
    for (const char* option : {"single_word", "lstrip", "rstrip"})
      if (flag(option))
        unsupported(origin, "added token \"" + content->string + "\"", std::string("with ") + option + "=true",
                    "single_word, lstrip and rstrip false");
    tokens_.push_back({int32_t(id->number), content->string, flag("special"), flag("normalized")});
  }
}

void AddedTokens::prepare(const Normalizer& normalizer) {
  for (const AddedToken& token : tokens_) {
    if (token.content.empty()) continue;
    if (token.normalized) normalized_.insert(normalizer.apply(token.content), token.id);
    else raw_.insert(token.content, token.id);
  }
}

std::vector<std::pair<std::string, int32_t>> AddedTokens::split(const std::string& text, bool normalized) const {
  const Trie& trie = normalized ? normalized_ : raw_;
  std::vector<std::pair<std::string, int32_t>> parts;
  if (trie.empty()) {
    if (!text.empty()) parts.emplace_back(text, -1);
    return parts;
  }
  size_t plain_start = 0, pos = 0;
  while (pos < text.size()) {
    int32_t id = -1;
    size_t length = trie.longest_at(text, pos, id);
    if (length == 0) {
      ++pos;
      continue;
    }
    if (pos > plain_start) parts.emplace_back(text.substr(plain_start, pos - plain_start), -1);
    parts.emplace_back(std::string(), id);
    pos += length;
    plain_start = pos;
  }
  if (plain_start < text.size()) parts.emplace_back(text.substr(plain_start), -1);
  return parts;
}

}  // namespace es
