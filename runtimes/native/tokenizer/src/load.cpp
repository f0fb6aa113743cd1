// load.cpp - reading tokenizer.json (streaming its big vocab / merges) and tokenizer_config.json.

#include <algorithm>
#include <fstream>
#include <sstream>

#include "impl.h"
#include "json.h"

namespace es {

namespace {

std::string read_file(const std::string& path, bool& found) {
  std::ifstream in(path, std::ios::binary);
  found = bool(in);
  if (!found) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// "merges": ["a b", ...] (the legacy form) or [["a", "b"], ...].
std::vector<std::pair<std::string, std::string>> read_merges(json::Reader& reader) {
  std::vector<std::pair<std::string, std::string>> merges;
  reader.begin_array();
  while (reader.next_element()) {
    if (reader.peek() == json::Type::String) {
      std::string line = reader.read_string();
      size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        reader.fail("merge \"" + line + "\" is not two tokens separated by one space");
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else {
      reader.begin_array();
      std::string parts[2];
      for (std::string& part : parts) {
        if (!reader.next_element()) reader.fail("a merge pair has fewer than two tokens");
        part = reader.read_string();
      }
      if (reader.next_element()) reader.fail("a merge pair has more than two tokens");
      merges.emplace_back(std::move(parts[0]), std::move(parts[1]));
    }
  }
  return merges;
}

void read_model(json::Reader& reader, Tokenizer::Impl& impl) {
  std::vector<std::string> tokens;  // by id
  std::vector<unsigned char> present;
  std::vector<std::pair<std::string, std::string>> merges;
  json::Value options;
  options.type = json::Type::Object;
  std::string key, type;
  reader.begin_object();
  while (reader.next_key(key)) {
    if (key == "vocab") {
      reader.begin_object();
      std::string token;
      while (reader.next_key(token)) {
        double id = reader.read_number();
        if (id < 0 || id > 16777216.0 || id != double(int32_t(id))) reader.fail("a vocabulary id is not a valid id");
        size_t at = size_t(id);
        if (at >= tokens.size()) {
          tokens.resize(at + 1);
          present.resize(at + 1, 0);
        }
        if (present[at]) reader.fail("the vocabulary gives id " + std::to_string(at) + " to two tokens");
        tokens[at].swap(token);
        present[at] = 1;
      }
    } else if (key == "merges") {
      merges = read_merges(reader);
    } else if (key == "type") {
      type = reader.read_string();
    } else {
      options.object[key] = reader.read_value();
    }
  }
  if (type != "BPE")
    unsupported(impl.origin, "model", "\"" + type + "\"", "BPE");
  impl.model.load(std::move(tokens), std::move(present), merges, options, impl.origin);
}

std::string token_text(const json::Value* value) {
  if (value == nullptr) return "";
  if (value->type == json::Type::String) return value->string;
  if (value->type == json::Type::Object) {
    const json::Value* content = value->find("content");
    if (content && content->type == json::Type::String) return content->string;
  }
  return "";
}

void read_config(const std::string& config_json, const std::string& origin, Tokenizer::Impl& impl) {
  if (config_json.empty()) return;
  json::Value config = json::parse(config_json, origin);
  if (config.type != json::Type::Object) throw TokenizerError(origin + ": the document is not a JSON object");
  auto id_of = [&](const char* key) -> int32_t {
    std::string text = token_text(config.find(key));
    if (text.empty()) return -1;
    auto added = impl.added_ids.find(text);
    if (added != impl.added_ids.end()) return added->second;
    int32_t id = impl.model.find(text);
    if (id < 0)
      throw TokenizerError(origin + ": " + key + " \"" + text + "\" is not in the vocabulary (re-export the bundle)");
    return id;
  };
  impl.bos_id = id_of("bos_token");
  impl.eos_id = id_of("eos_token");
  const json::Value* add_bos = config.find("add_bos_token");
  impl.add_bos_token = add_bos && add_bos->type == json::Type::Bool && add_bos->boolean;
}

void build_tables(Tokenizer::Impl& impl) {
  size_t size = impl.model.tokens().size();
  for (const AddedToken& token : impl.added.tokens()) size = std::max(size, size_t(token.id) + 1);
  impl.id_to_token = impl.model.tokens();
  impl.id_to_token.resize(size);
  impl.present = impl.model.present();
  impl.present.resize(size, 0);
  impl.special.assign(size, 0);
  for (const AddedToken& token : impl.added.tokens()) {
    // tokenizers gives a normalized added token's normalized text back (decode then sees that text)
    impl.id_to_token[token.id] = token.normalized ? impl.normalizer.apply(token.content) : token.content;
    impl.present[token.id] = 1;
    impl.special[token.id] = token.special;
    impl.added_ids.emplace(token.content, token.id);
  }
}

}  // namespace

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json, const std::string& config_json,
                               const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  json::Reader reader(tokenizer_json, origin);
  json::Value added, normalizer, pre_tokenizer, decoder, truncation;
  bool has_model = false;
  std::string key;
  reader.begin_object();
  while (reader.next_key(key)) {
    if (key == "model") {
      read_model(reader, *impl);
      has_model = true;
    } else if (key == "added_tokens") {
      added = reader.read_value();
    } else if (key == "normalizer") {
      normalizer = reader.read_value();
    } else if (key == "pre_tokenizer") {
      pre_tokenizer = reader.read_value();
    } else if (key == "decoder") {
      decoder = reader.read_value();
    } else if (key == "truncation") {
      truncation = reader.read_value();
    } else {
      reader.skip_value();  // version, padding, post_processor: encode() adds no special tokens
    }
  }
  reader.expect_end();
  if (!has_model) throw TokenizerError(origin + ": there is no \"model\" (the file is damaged; re-export it)");
  if (!truncation.is_null()) unsupported(origin, "truncation", "settings", "truncation null");

  impl->normalizer.load(normalizer, origin);
  impl->pre_tokenizer.load(pre_tokenizer, origin);
  impl->decoder.load(decoder, origin);
  impl->added.load(added, origin);
  impl->added.prepare(impl->normalizer);

  if (impl->decoder.byte_level() && impl->pre_tokenizer.has_byte_level()) {
    impl->family = "byte_level_bpe";
  } else if (!impl->decoder.byte_level() && !impl->pre_tokenizer.has_byte_level() && impl->decoder.byte_fallback()) {
    impl->family = "sentencepiece_bpe";
  } else {
    throw TokenizerError(origin + ": the pre-tokenizer and decoder match neither supported family (byte-level BPE: "
                         "ByteLevel pre-tokenizer + ByteLevel decoder; SentencePiece BPE: ByteFallback decoder, no "
                         "ByteLevel); the native tokenizer reads SmolLM2- and Gemma-style tokenizer.json files only");
  }
  build_tables(*impl);
  std::string config_origin = origin;
  size_t slash = config_origin.find_last_of('/');
  config_origin = (slash == std::string::npos ? "" : config_origin.substr(0, slash + 1)) + "tokenizer_config.json";
  read_config(config_json, config_origin, *impl);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_folder(const std::string& folder) {
  std::string base = folder.empty() || folder.back() == '/' ? folder : folder + "/";
  bool found = false;
  std::string tokenizer_json = read_file(base + "tokenizer.json", found);
  if (!found)
    throw TokenizerError(base + "tokenizer.json is missing or unreadable; the bundle needs the Hugging Face "
                         "tokenizer.json its model was exported with (re-export the bundle)");
  std::string config_json = read_file(base + "tokenizer_config.json", found);
  return from_json(tokenizer_json, config_json, base + "tokenizer.json");
}

}  // namespace es
