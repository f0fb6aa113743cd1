// json.h - the native runner's one JSON reader, strict (RFC 8259): a pull reader for the big arrays of
// tokenizer.json (vocab, merges) and a tiny DOM for the small objects around them (normalizer, decoder, configs).
// The runner's es::Json (runtimes/native/src/json.h: manifest.json, the host check's cache, the test vectors) is
// built on this Reader too (CMake's edge_spec_json library: this file + utf8.cpp).
//
// Strict: no comments, no trailing commas, no NaN (unless allow_python_constants: Python's json.dumps writes NaN,
// Infinity, -Infinity), no leading zeros, no control characters in strings, surrogate pairs checked, at most
// MAX_DEPTH nested containers. Errors throw es::json::SyntaxError (an es::TokenizerError) with the origin and the
// byte offset.

#ifndef ES_TOKENIZER_JSON_H
#define ES_TOKENIZER_JSON_H

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "es_tokenizer.h"

namespace es {
namespace json {

constexpr size_t MAX_DEPTH = 257;  // nested arrays / objects (deeper input is refused, not a stack overflow)

// A malformed document: what() is "<origin>: invalid JSON at byte N: <detail> (the file is damaged; re-export the
// bundle)"; offset() and detail() give the parts (es::Json words its own message from them).
class SyntaxError : public TokenizerError {
 public:
  SyntaxError(const std::string& origin, size_t offset, const std::string& detail);
  size_t offset() const { return offset_; }
  const std::string& detail() const { return detail_; }

 private:
  size_t offset_;
  std::string detail_;
};

enum class Type { Null, Bool, Number, String, Array, Object };

const char* type_name(Type type);

// A parsed value. Objects keep their keys sorted (duplicate keys are an error).
struct Value {
  Type type = Type::Null;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<Value> array;
  std::map<std::string, Value> object;

  bool is_null() const { return type == Type::Null; }
  // Object member or nullptr when absent.
  const Value* find(const std::string& key) const;
};

class Reader {
 public:
  Reader(const std::string& text, std::string origin);
  // Also read Python's json.dumps constants NaN, Infinity, -Infinity as numbers (es::Json does; tokenizer.json never).
  void allow_python_constants() { python_constants_ = true; }

  Type peek();                         // the type of the next value (skips whitespace)
  void read_null();
  bool read_bool();
  double read_number();
  std::string read_string();
  Value read_value();                  // any value, as a DOM
  void skip_value();

  void begin_object();                 // '{'
  bool next_key(std::string& key);     // false at '}' (consumed); otherwise the key and its ':'
  void begin_array();                  // '['
  bool next_element();                 // false at ']' (consumed)
  void expect_end();                   // only whitespace left

  [[noreturn]] void fail(const std::string& what) const;

 private:
  void skip_ws();
  char peek_char();
  void expect(char c);
  void read_string_into(std::string& out);
  void append_escape(std::string& out);
  unsigned read_hex4();

  const std::string& text_;
  std::string origin_;
  size_t pos_ = 0;
  bool python_constants_ = false;
  // per open container: has it produced an element yet (for comma handling)
  std::vector<bool> started_;
};

// Parses a whole document into a DOM.
Value parse(const std::string& text, const std::string& origin);

}  // namespace json
}  // namespace es

#endif  // ES_TOKENIZER_JSON_H
