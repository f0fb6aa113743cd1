// json.cpp - recursive-descent JSON parser (RFC 8259; \uXXXX escapes with surrogate pairs to UTF-8).
#include "json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace es {

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}

  Json document() {
    Json v = value(0);
    skip_ws();
    if (i_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw JsonError("invalid JSON at byte " + std::to_string(i_) + ": " + what);
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool consume(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(i_, n, word) != 0) return false;
    i_ += n;
    return true;
  }

  Json value(int depth) {
    if (depth > 256) fail("nesting deeper than 256");
    skip_ws();
    if (i_ >= s_.size()) fail("unexpected end of input");
    Json v;
    char c = s_[i_];
    if (c == '{') {
      v.type_ = Json::Type::Object;
      ++i_;
      skip_ws();
      if (i_ < s_.size() && s_[i_] == '}') { ++i_; return v; }
      while (true) {
        skip_ws();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string key");
        std::string key = string();
        skip_ws();
        if (i_ >= s_.size() || s_[i_] != ':') fail("expected ':'");
        ++i_;
        v.object_[key] = value(depth + 1);
        skip_ws();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        if (i_ < s_.size() && s_[i_] == '}') { ++i_; return v; }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.type_ = Json::Type::Array;
      ++i_;
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ']') { ++i_; return v; }
      while (true) {
        v.array_.push_back(value(depth + 1));
        skip_ws();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        if (i_ < s_.size() && s_[i_] == ']') { ++i_; return v; }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.type_ = Json::Type::String;
      v.string_ = string();
      return v;
    }
    if (consume("true")) { v.type_ = Json::Type::Bool; v.bool_ = true; return v; }
    if (consume("false")) { v.type_ = Json::Type::Bool; v.bool_ = false; return v; }
    if (consume("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) {
      const char* begin = s_.c_str() + i_;
      char* end = nullptr;
      v.type_ = Json::Type::Number;
      v.number_ = std::strtod(begin, &end);
      if (end == begin) fail("bad number");
      i_ += static_cast<size_t>(end - begin);
      return v;
    }
    if (consume("NaN")) { v.type_ = Json::Type::Number; v.number_ = NAN; return v; }  // Python's json.dumps
    if (consume("Infinity")) { v.type_ = Json::Type::Number; v.number_ = INFINITY; return v; }
    if (consume("-Infinity")) { v.type_ = Json::Type::Number; v.number_ = -INFINITY; return v; }
    fail(std::string("unexpected character '") + c + "'");
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[i_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= unsigned(h - '0');
      else if (h >= 'a' && h <= 'f') u |= unsigned(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= unsigned(h - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return u;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (c != '\\') { out += c; continue; }
      if (i_ >= s_.size()) fail("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 6 <= s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            size_t keep = i_;
            i_ += 2;
            unsigned lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else i_ = keep;
          }
          put_utf8(out, cp);
          break;
        }
        default: fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }
};

Json Json::parse(const std::string& text) { return JsonParser(text).document(); }

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
