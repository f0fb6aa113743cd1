// json.cpp - es::Json over the runner's one JSON reader (tokenizer/src/json.h: es::json::Reader, strict RFC 8259,
// plus Python's NaN / Infinity / -Infinity, which json.dumps writes): its pull API builds the tree here, a repeated
// key keeping its last value (as Python's json.loads); accessors, dump() and json_quote below.
#include "json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "../tokenizer/src/json.h"

namespace es {

class JsonParser {
 public:
  static Json document(const std::string& text) {
    json::Reader reader(text, "");
    reader.allow_python_constants();
    try {
      Json v = value(reader);
      reader.expect_end();
      return v;
    } catch (const json::SyntaxError& err) {
      throw JsonError("invalid JSON at byte " + std::to_string(err.offset()) + ": " + err.detail());
    }
  }

 private:
  static Json value(json::Reader& r) {
    Json v;
    switch (r.peek()) {
      case json::Type::Null: r.read_null(); break;
      case json::Type::Bool: v.type_ = Json::Type::Bool; v.bool_ = r.read_bool(); break;
      case json::Type::Number: v.type_ = Json::Type::Number; v.number_ = r.read_number(); break;
      case json::Type::String: v.type_ = Json::Type::String; v.string_ = r.read_string(); break;
      case json::Type::Array:
        v.type_ = Json::Type::Array;
        r.begin_array();
        while (r.next_element()) v.array_.push_back(value(r));
        break;
      case json::Type::Object: {
        v.type_ = Json::Type::Object;
        r.begin_object();
        std::string key;
        while (r.next_key(key)) v.object_[key] = value(r);
        break;
      }
    }
    return v;
  }
};

Json Json::parse(const std::string& text) { return JsonParser::document(text); }

static const char* type_name(Json::Type t) {
  switch (t) {
    case Json::Type::Null: return "null";
    case Json::Type::Bool: return "a boolean";
    case Json::Type::Number: return "a number";
    case Json::Type::String: return "a string";
    case Json::Type::Array: return "an array";
    case Json::Type::Object: return "an object";
  }
  return "?";
}

static void want(const Json& j, Json::Type t) {
  if (j.type() != t)
    throw JsonError(std::string("expected ") + type_name(t) + ", found " + type_name(j.type()));
}

bool Json::as_bool() const { want(*this, Type::Bool); return bool_; }
double Json::as_number() const { want(*this, Type::Number); return number_; }
int64_t Json::as_int() const {
  want(*this, Type::Number);
  if (std::floor(number_) != number_) throw JsonError("expected an integer, found " + std::to_string(number_));
  return static_cast<int64_t>(number_);
}
const std::string& Json::as_string() const { want(*this, Type::String); return string_; }
const std::vector<Json>& Json::as_array() const { want(*this, Type::Array); return array_; }
const std::map<std::string, Json>& Json::as_object() const { want(*this, Type::Object); return object_; }

bool Json::has(const std::string& key) const { return type_ == Type::Object && object_.count(key) > 0; }

const Json& Json::at(const std::string& key) const {
  want(*this, Type::Object);
  auto it = object_.find(key);
  if (it == object_.end()) throw JsonError("missing field '" + key + "'");
  return it->second;
}

const Json& Json::get(const std::string& key) const {
  static const Json null_value;
  if (type_ != Type::Object) return null_value;
  auto it = object_.find(key);
  return it == object_.end() ? null_value : it->second;
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  return out + "\"";
}

std::string Json::dump() const {
  switch (type_) {
    case Type::Null: return "null";
    case Type::Bool: return bool_ ? "true" : "false";
    case Type::Number: {
      if (std::floor(number_) == number_ && std::fabs(number_) < 1e15) return std::to_string(int64_t(number_));
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", number_);
      return buf;
    }
    case Type::String: return json_quote(string_);
    case Type::Array: {
      std::string out = "[";
      for (size_t i = 0; i < array_.size(); ++i) out += (i ? "," : "") + array_[i].dump();
      return out + "]";
    }
    case Type::Object: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : object_) {
        out += (first ? "" : ",") + json_quote(kv.first) + ":" + kv.second.dump();
        first = false;
      }
      return out + "}";
    }
  }
  return "null";
}

}  // namespace es
