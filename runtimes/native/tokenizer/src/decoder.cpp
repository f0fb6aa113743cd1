// decoder.cpp - token strings -> text, the decoders of the two families, as tokenizers' decode_chain.

#include "components.h"
#include "es_tokenizer.h"
#include "utf8.h"

namespace es {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xNN>" -> NN, or -1 (parsed like Rust's u8::from_str_radix(_, 16), which also takes "+N").
int fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  if (token[3] == '+') return hex_digit(token[4]);
  int high = hex_digit(token[3]), low = hex_digit(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

std::string replace_all(const std::string& text, const std::string& pattern, const std::string& content) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t hit = text.find(pattern, pos);
    if (hit == std::string::npos) break;
    out.append(text, pos, hit - pos);
    out += content;
    pos = hit + pattern.size();
  }
  out.append(text, pos, std::string::npos);
  return out;
}

// The raw bytes of a byte-level token (all its characters mapped), or the token itself when one of its
// characters is outside the byte map (added tokens like "<|im_start|>" whose text is plain).
std::string byte_level_bytes(const std::string& token) {
  std::string bytes;
  for (char32_t cp : utf8::decode(token)) {
    int b = char_to_byte(cp);
    if (b < 0) return token;
    bytes += static_cast<char>(b);
  }
  return bytes;
}

std::string strip(const std::string& token, const std::string& content, size_t start, size_t stop) {
  std::vector<char32_t> cps = utf8::decode(token);
  std::vector<char32_t> target = utf8::decode(content);
  char32_t c = target.empty() ? 0 : target[0];
  size_t begin = 0, end = cps.size();
  while (begin < start && begin < end && cps[begin] == c) ++begin;
  for (size_t i = 0; i < stop && end > begin && cps[end - 1] == c; ++i) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) utf8::append(out, cps[i]);
  return out;
}

}  // namespace

void Decoder::load(const json::Value& config, const std::string& origin) {
  if (config.is_null())
    throw TokenizerError(origin + ": the tokenizer has no decoder (byte-level BPE needs ByteLevel, "
                         "SentencePiece BPE needs Replace/ByteFallback/Fuse); re-export the tokenizer");
  add(config, origin);
  for (size_t i = 0; i < steps_.size(); ++i)
    if (steps_[i].kind == Kind::ByteLevel && steps_.size() != 1)
      unsupported(origin, "decoder", "ByteLevel inside a Sequence", "ByteLevel alone");
  byte_level_ = steps_.size() == 1 && steps_[0].kind == Kind::ByteLevel;
}

void Decoder::add(const json::Value& config, const std::string& origin) {
  const std::string& type = type_of(config, origin, "decoder");
  Step step;
  if (type == "Sequence") {
    const json::Value* list = config.find("decoders");
    if (list == nullptr || list->type != json::Type::Array)
      throw TokenizerError(origin + ": decoder Sequence has no \"decoders\" array");
    for (const json::Value& item : list->array) add(item, origin);
    return;
  } else if (type == "ByteLevel") {
    step.kind = Kind::ByteLevel;
  } else if (type == "Replace") {
    step.kind = Kind::Replace;
    step.pattern = string_pattern(config, origin, "decoder Replace");
    const json::Value* content = config.find("content");
    if (content == nullptr || content->type != json::Type::String)
      throw TokenizerError(origin + ": decoder Replace has no \"content\" string");
    step.content = content->string;
  } else if (type == "ByteFallback") {
    step.kind = Kind::ByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::Fuse;
  } else if (type == "Strip") {
    step.kind = Kind::Strip;
    const json::Value* content = config.find("content");
    const json::Value* start = config.find("start");
    const json::Value* stop = config.find("stop");
    if (!content || content->type != json::Type::String || utf8::decode(content->string).size() != 1 || !start ||
        start->type != json::Type::Number || !stop || stop->type != json::Type::Number)
      throw TokenizerError(origin + ": decoder Strip needs a one-character \"content\" and numbers \"start\", \"stop\"");
    step.content = content->string;
    step.start = size_t(start->number);
    step.stop = size_t(stop->number);
  } else {
    unsupported(origin, "decoder", "\"" + type + "\"", "ByteLevel, or a Sequence of Replace, ByteFallback, Fuse, Strip");
  }
  steps_.push_back(step);
}

bool Decoder::byte_fallback() const {
  for (const Step& step : steps_)
    if (step.kind == Kind::ByteFallback) return true;
  return false;
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  for (const Step& step : steps_) {
    std::vector<std::string> next;
    switch (step.kind) {
      case Kind::ByteLevel: {
        std::string bytes;
        for (const std::string& token : tokens) bytes += byte_level_bytes(token);
        next.push_back(utf8::lossy(bytes));
        break;
      }
      case Kind::Replace:
        for (const std::string& token : tokens) next.push_back(replace_all(token, step.pattern, step.content));
        break;
      case Kind::ByteFallback: {
        std::string run;  // consecutive byte tokens: valid UTF-8 as a whole, or one U+FFFD per byte
        size_t run_tokens = 0;
        auto flush = [&]() {
          if (run_tokens == 0) return;
          if (utf8::find_invalid(run) == std::string::npos) next.push_back(run);
          else
            for (size_t i = 0; i < run_tokens; ++i) next.push_back("\xEF\xBF\xBD");
          run.clear();
          run_tokens = 0;
        };
        for (const std::string& token : tokens) {
          int b = fallback_byte(token);
          if (b >= 0) {
            run += static_cast<char>(b);
            ++run_tokens;
          } else {
            flush();
            next.push_back(token);
          }
        }
        flush();
        break;
      }
      case Kind::Fuse: {
        std::string all;
        for (const std::string& token : tokens) all += token;
        next.push_back(all);
        break;
      }
      case Kind::Strip:
        for (const std::string& token : tokens) next.push_back(strip(token, step.content, step.start, step.stop));
        break;
    }
    tokens.swap(next);
  }
  std::string out;
  for (const std::string& token : tokens) out += token;
  return out;
}

std::string Decoder::token_bytes(const std::string& token, bool at_start) const {
  std::string text = token;
  bool fused = false;
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::ByteLevel: text = byte_level_bytes(text); break;
      case Kind::Replace: text = replace_all(text, step.pattern, step.content); break;
      case Kind::ByteFallback: {
        int b = fallback_byte(text);
        if (b >= 0) text = std::string(1, static_cast<char>(b));
        break;
      }
      case Kind::Fuse: fused = true; break;
      case Kind::Strip:
        if (utf8::find_invalid(text) != std::string::npos) break;  // a lone fallback byte is never the content
        // before Fuse: every token is stripped; after it: only the start of the whole text (a strip at
        // the end of the text cannot be known while streaming)
        if (!fused) text = strip(text, step.content, step.start, step.stop);
        else if (at_start) text = strip(text, step.content, step.start, 0);
        break;
    }
  }
  return text;
}

}  // namespace es
