// json.h - JSON trees for manifest.json, the host check's cache and the shared test vectors, read by the runner's one
// JSON reader (tokenizer/src/json.h, standard library only; json.cpp builds the tree from it).
//
// Values are immutable trees; accessors throw JsonError naming the key path that is missing or mistyped,
// so a malformed manifest is refused with the field named (the caller adds the file and the fix).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace es {

class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Json {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };

  static Json parse(const std::string& text);  // throws JsonError("invalid JSON at byte N: ...")

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }

  bool as_bool() const;
  double as_number() const;
  int64_t as_int() const;  // a number with no fractional part
  const std::string& as_string() const;
  const std::vector<Json>& as_array() const;
  const std::map<std::string, Json>& as_object() const;

  bool has(const std::string& key) const;             // an object holding `key`
  const Json& at(const std::string& key) const;       // throws JsonError("missing field 'key'")
  const Json& get(const std::string& key) const;      // null when absent
  std::string dump() const;                            // compact JSON text (strings escaped)

 private:
  Type type_ = Type::Null;
  bool bool_ = false;
  double number_ = 0.0;
  std::string string_;
  std::vector<Json> array_;
  std::map<std::string, Json> object_;
  friend class JsonParser;
};

std::string json_quote(const std::string& s);  // "..." with JSON escapes

}  // namespace es
