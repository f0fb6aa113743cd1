// json.h - a small, strict JSON reader (RFC 8259): a pull reader for the big arrays of tokenizer.json
// (vocab, merges) and a tiny DOM for the small objects around them (normalizer, decoder, configs).
//
// Strict: no comments, no trailing commas, no NaN, no leading zeros, no control characters in strings,
// surrogate pairs checked. Errors throw es::TokenizerError with the origin and the byte offset.

#ifndef ES_TOKENIZER_JSON_H
#define ES_TOKENIZER_JSON_H

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace es {
namespace json {

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
  // per open container: has it produced an element yet (for comma handling)
  std::vector<bool> started_;
};

// Parses a whole document into a DOM.
Value parse(const std::string& text, const std::string& origin);

}  // namespace json
}  // namespace es

#endif  // ES_TOKENIZER_JSON_H
