// es_tokenizer_diff - runs JSONL cases through es::Tokenizer, for tests/test_native_tokenizer.py to compare
// with Hugging Face `tokenizers`.
//
//   es_tokenizer_diff <bundle folder with tokenizer.json> <cases.jsonl> <results.jsonl>
//
// One case per line; text is passed as hex so that invalid UTF-8 can be expressed:
//   {"op": "encode", "hex": "68 69"}                      -> {"ids": [...]} or {"error": "..."}
//   {"op": "decode", "ids": [...], "skip_special": true}  -> {"hex": "..."}
//   {"op": "stream", "ids": [...], "skip_special": true}  -> {"chunks": ["hex", ...]} (the last: finish())
//   {"op": "chat", "format": "chatml", "default_system": "", "bos": "", "gen": true,
//    "messages": [{"role": "user", "content_hex": "..."}]} -> {"hex": "..."}
//   {"op": "prompt", "hex": "...", "chat": true, "format": "chatml", "default_system": "", "bos": ""}
//                                                        -> {"ids": [...]} (Tokenizer::encode_prompt)
//   {"op": "info"} -> {"family": ..., "vocab_size": n, "bos_id": n, "eos_id": n, "add_bos_token": b}
// Timings go to stderr.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "es_tokenizer.h"
#include "json.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string from_hex(const std::string& hex) {
  std::string out;
  int high = -1;
  for (char c : hex) {
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (v < 0) continue;  // separators
    if (high < 0) {
      high = v;
    } else {
      out += static_cast<char>(high * 16 + v);
      high = -1;
    }
  }
  return out;
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::string quote(const std::string& text) {  // a JSON string (ASCII-safe: bytes >= 0x80 pass through)
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::vector<int32_t> ids_of(const es::json::Value& item) {
  std::vector<int32_t> ids;
  const es::json::Value* list = item.find("ids");
  if (list)
    for (const es::json::Value& v : list->array) ids.push_back(int32_t(v.number));
  return ids;
}

bool flag(const es::json::Value& item, const char* key, bool fallback) {
  const es::json::Value* v = item.find(key);
  return v && v->type == es::json::Type::Bool ? v->boolean : fallback;
}

std::string text(const es::json::Value& item, const char* key) {
  const es::json::Value* v = item.find(key);
  return v && v->type == es::json::Type::String ? v->string : "";
}

std::string run_case(const es::Tokenizer& tok, const es::json::Value& item) {
  std::string op = text(item, "op");
  std::ostringstream out;
  if (op == "encode") {
    std::vector<int32_t> ids = tok.encode(from_hex(text(item, "hex")));
    out << "{\"ids\": [";
    for (size_t i = 0; i < ids.size(); ++i) out << (i ? ", " : "") << ids[i];
    out << "]}";
  } else if (op == "decode") {
    out << "{\"hex\": \"" << to_hex(tok.decode(ids_of(item), flag(item, "skip_special", true))) << "\"}";
  } else if (op == "stream") {
    es::StreamDecoder stream(tok, flag(item, "skip_special", true));
    out << "{\"chunks\": [";
    for (int32_t id : ids_of(item)) out << "\"" << to_hex(stream.push(id)) << "\", ";
    out << "\"" << to_hex(stream.finish()) << "\"]}";
  } else if (op == "chat") {
    es::ChatFormat format = es::chat_format(text(item, "format"), text(item, "default_system"), text(item, "bos"));
    std::vector<es::ChatMessage> messages;
    if (const es::json::Value* list = item.find("messages"))
      for (const es::json::Value& m : list->array) messages.push_back({text(m, "role"), from_hex(text(m, "content_hex"))});
    out << "{\"hex\": \"" << to_hex(es::format_chat(format, messages, flag(item, "gen", true))) << "\"}";
  } else if (op == "prompt") {
    es::ChatFormat format;
    bool chat = flag(item, "chat", false);
    if (chat) format = es::chat_format(text(item, "format"), text(item, "default_system"), text(item, "bos"));
    std::vector<int32_t> ids = tok.encode_prompt(from_hex(text(item, "hex")), chat ? &format : nullptr);
    out << "{\"ids\": [";
    for (size_t i = 0; i < ids.size(); ++i) out << (i ? ", " : "") << ids[i];
    out << "]}";
  } else if (op == "info") {
    out << "{\"family\": " << quote(tok.family()) << ", \"vocab_size\": " << tok.vocab_size()
        << ", \"bos_id\": " << tok.bos_id() << ", \"eos_id\": " << tok.eos_id()
        << ", \"add_bos_token\": " << (tok.add_bos_token() ? "true" : "false") << "}";
  } else {
    out << "{\"error\": " << quote("unknown op \"" + op + "\"") << "}";
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: es_tokenizer_diff <folder with tokenizer.json> <cases.jsonl> <results.jsonl>\n";
    return 2;
  }
  try {
    auto start = Clock::now();
    es::Tokenizer tok = es::Tokenizer::from_folder(argv[1]);
    auto loaded = Clock::now();
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) throw es::TokenizerError(std::string(argv[2]) + " cannot be read");
    std::ofstream out(argv[3], std::ios::binary);
    std::string line;
    size_t count = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      es::json::Value item = es::json::parse(line, std::string(argv[2]) + " line " + std::to_string(count + 1));
      try {
        out << run_case(tok, item) << "\n";
      } catch (const es::TokenizerError& err) {
        out << "{\"error\": " << quote(err.what()) << "}\n";
      }
      ++count;
    }
    auto done = Clock::now();
    auto ms = [](Clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
    std::cerr << "es_tokenizer_diff: " << tok.family() << " vocab " << tok.vocab_size() << " loaded in "
              << ms(loaded - start) << " ms; " << count << " cases in " << ms(done - loaded) << " ms\n";
  } catch (const std::exception& err) {
    std::cerr << "es_tokenizer_diff: " << err.what() << "\n";
    return 1;
  }
  return 0;
}
