// normalizer.cpp - Replace / Prepend / Sequence normalizers, and the helpers all components share.

#include "components.h"
#include "es_tokenizer.h"

namespace es {

void unsupported(const std::string& origin, const std::string& component, const std::string& what,
                 const std::string& supported) {
  throw TokenizerError(origin + ": " + component + " " + what + " is not supported (supported: " + supported +
                       "); the native tokenizer reads byte-level BPE (SmolLM2) and SentencePiece-style BPE "
                       "with byte fallback (Gemma) tokenizer.json files only");
}

std::string string_pattern(const json::Value& config, const std::string& origin, const std::string& component) {
  const json::Value* pattern = config.find("pattern");
  if (pattern == nullptr || pattern->type != json::Type::Object)
    throw TokenizerError(origin + ": " + component + " has no \"pattern\" object (re-export the tokenizer)");
  const json::Value* literal = pattern->find("String");
  if (literal == nullptr || literal->type != json::Type::String) {
    std::string kind = pattern->object.empty() ? "{}" : pattern->object.begin()->first;
    unsupported(origin, component, "with a " + kind + " pattern", "a {\"String\": ...} pattern");
  }
  if (literal->string.empty()) throw TokenizerError(origin + ": " + component + " has an empty pattern");
  return literal->string;
}

const std::string& type_of(const json::Value& config, const std::string& origin, const std::string& component) {
  const json::Value* type = config.find("type");
  if (config.type != json::Type::Object || type == nullptr || type->type != json::Type::String)
    throw TokenizerError(origin + ": " + component + " has no \"type\" (the file is damaged; re-export it)");
  return type->string;
}

void Normalizer::load(const json::Value& config, const std::string& origin) {
  if (!config.is_null()) add(config, origin);
}

void Normalizer::add(const json::Value& config, const std::string& origin) {
  const std::string& type = type_of(config, origin, "normalizer");
  if (type == "Sequence") {
    const json::Value* list = config.find("normalizers");
    if (list == nullptr || list->type != json::Type::Array)
      throw TokenizerError(origin + ": normalizer Sequence has no \"normalizers\" array");
    for (const json::Value& item : list->array) add(item, origin);
  } else if (type == "Replace") {
    const json::Value* content = config.find("content");
    if (content == nullptr || content->type != json::Type::String)
      throw TokenizerError(origin + ": normalizer Replace has no \"content\" string");
    steps_.push_back({false, string_pattern(config, origin, "normalizer Replace"), content->string});
  } else if (type == "Prepend") {
    const json::Value* prepend = config.find("prepend");
    if (prepend == nullptr || prepend->type != json::Type::String)
      throw TokenizerError(origin + ": normalizer Prepend has no \"prepend\" string");
    steps_.push_back({true, "", prepend->string});
  } else {
    unsupported(origin, "normalizer", "\"" + type + "\"", "Replace with a string pattern, Prepend, Sequence");
  }
}

std::string Normalizer::apply(const std::string& text) const {
  std::string current = text;
  for (const Step& step : steps_) {
    if (step.prepend) {
      if (!current.empty()) current = step.content + current;  // tokenizers prepends to non-empty text only
      continue;
    }
    std::string out;
    size_t pos = 0;
    while (true) {
      size_t hit = current.find(step.pattern, pos);
      if (hit == std::string::npos) break;
      out.append(current, pos, hit - pos);
      out += step.content;
      pos = hit + step.pattern.size();
    }
    out.append(current, pos, std::string::npos);
    current.swap(out);
  }
  return current;
}

}  // namespace es
