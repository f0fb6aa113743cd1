// json.cpp - the strict pull reader and DOM of json.h.

#include "json.h"

#include <cmath>
#include <cstdlib>

#include "es_tokenizer.h"
#include "utf8.h"

namespace es {
namespace json {

const char* type_name(Type type) {
  switch (type) {
    case Type::Null: return "null";
    case Type::Bool: return "a boolean";
    case Type::Number: return "a number";
    case Type::String: return "a string";
    case Type::Array: return "an array";
    case Type::Object: return "an object";
  }
  return "?";
}

const Value* Value::find(const std::string& key) const {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &it->second;
}

Reader::Reader(const std::string& text, std::string origin) : text_(text), origin_(std::move(origin)) {}

SyntaxError::SyntaxError(const std::string& origin, size_t offset, const std::string& detail)
    : TokenizerError(origin + ": invalid JSON at byte " + std::to_string(offset) + ": " + detail +
                     " (the file is damaged; re-export the bundle)"),
      offset_(offset),
      detail_(detail) {}

void Reader::fail(const std::string& what) const { throw SyntaxError(origin_, pos_, what); }

void Reader::skip_ws() {
  while (pos_ < text_.size()) {
    char c = text_[pos_];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    ++pos_;
  }
}

char Reader::peek_char() {
  skip_ws();
  if (pos_ >= text_.size()) fail("unexpected end of input");
  return text_[pos_];
}

void Reader::expect(char c) {
  if (peek_char() != c) fail(std::string("expected '") + c + "'");
  ++pos_;
}

Type Reader::peek() {
  char c = peek_char();
  switch (c) {
    case 'n': return Type::Null;
    case 't': case 'f': return Type::Bool;
    case '"': return Type::String;
    case '[': return Type::Array;
    case '{': return Type::Object;
    default:
      if (c == '-' || (c >= '0' && c <= '9')) return Type::Number;
      if (python_constants_ && (c == 'N' || c == 'I')) return Type::Number;
      fail(std::string("unexpected character '") + c + "'");
  }
}

void Reader::read_null() {
  skip_ws();
  if (text_.compare(pos_, 4, "null") != 0) fail("expected null");
  pos_ += 4;
}

bool Reader::read_bool() {
  skip_ws();
  if (text_.compare(pos_, 4, "true") == 0) { pos_ += 4; return true; }
  if (text_.compare(pos_, 5, "false") == 0) { pos_ += 5; return false; }
  fail("expected true or false");
}

double Reader::read_number() {
  skip_ws();
  if (python_constants_) {  // NaN, Infinity, -Infinity (Python's json.dumps)
    for (const char* word : {"NaN", "Infinity", "-Infinity"})
      if (text_.compare(pos_, std::char_traits<char>::length(word), word) == 0) {
        pos_ += std::char_traits<char>::length(word);
        return word[0] == 'N' ? NAN : word[0] == '-' ? -INFINITY : INFINITY;
      }
  }
  size_t start = pos_;
  auto digit = [&](size_t p) { return p < text_.size() && text_[p] >= '0' && text_[p] <= '9'; };
  if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
  if (!digit(pos_)) fail("expected a digit");
  if (text_[pos_] == '0') {
    ++pos_;
    if (digit(pos_)) fail("leading zeros are not allowed");
  } else {
    while (digit(pos_)) ++pos_;
  }
  bool integer = true;
  if (pos_ < text_.size() && text_[pos_] == '.') {
    integer = false;
    ++pos_;
    if (!digit(pos_)) fail("expected a digit after '.'");
    while (digit(pos_)) ++pos_;
  }
  if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    integer = false;
    ++pos_;
    if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
    if (!digit(pos_)) fail("expected a digit in the exponent");
    while (digit(pos_)) ++pos_;
  }
  // Integers (all that tokenizer.json holds but for dropout) are read here: strtod follows the C locale's
  // decimal point, which an app may have changed.
  bool negative = text_[start] == '-';
  size_t digits = pos_ - start - (negative ? 1 : 0);
  if (integer && digits <= 15) {
    double value = 0;
    for (size_t i = start + (negative ? 1 : 0); i < pos_; ++i) value = value * 10 + (text_[i] - '0');
    return negative ? -value : value;
  }
  std::string literal = text_.substr(start, pos_ - start);
  double value = std::strtod(literal.c_str(), nullptr);
  if (!std::isfinite(value)) fail("number out of range");
  return value;
}

unsigned Reader::read_hex4() {
  if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
  unsigned value = 0;
  for (int i = 0; i < 4; ++i) {
    char c = text_[pos_++];
    value <<= 4;
    if (c >= '0' && c <= '9') value |= unsigned(c - '0');
    else if (c >= 'a' && c <= 'f') value |= unsigned(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') value |= unsigned(c - 'A' + 10);
    else fail("bad hex digit in \\u escape");
  }
  return value;
}

void Reader::append_escape(std::string& out) {
  if (pos_ >= text_.size()) fail("truncated escape");
  char c = text_[pos_++];
  switch (c) {
    case '"': out += '"'; return;
    case '\\': out += '\\'; return;
    case '/': out += '/'; return;
    case 'b': out += '\b'; return;
    case 'f': out += '\f'; return;
    case 'n': out += '\n'; return;
    case 'r': out += '\r'; return;
    case 't': out += '\t'; return;
    case 'u': break;
    default: --pos_; fail(std::string("unknown escape '\\") + c + "'");
  }
  unsigned cp = read_hex4();
  if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in \\u escape");
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    if (text_.compare(pos_, 2, "\\u") != 0) fail("high surrogate without its low surrogate");
    pos_ += 2;
    unsigned low = read_hex4();
    if (low < 0xDC00 || low > 0xDFFF) fail("high surrogate followed by a non-low surrogate");
    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
  }
  utf8::append(out, char32_t(cp));
}

void Reader::read_string_into(std::string& out) {
  expect('"');
  size_t run = pos_;
  while (true) {
    if (pos_ >= text_.size()) fail("unterminated string");
    unsigned char c = static_cast<unsigned char>(text_[pos_]);
    if (c == '"') {
      out.append(text_, run, pos_ - run);
      ++pos_;
      return;
    }
    if (c == '\\') {
      out.append(text_, run, pos_ - run);
      ++pos_;
      append_escape(out);
      run = pos_;
      continue;
    }
    if (c < 0x20) fail("control character in a string (must be escaped)");
    if (c < 0x80) {
      ++pos_;
      continue;
    }
    size_t length = utf8::valid_sequence_length(text_, pos_);
    if (length == 0) fail("invalid UTF-8 in a string");
    pos_ += length;
  }
}

std::string Reader::read_string() {
  std::string out;
  read_string_into(out);
  return out;
}

void Reader::begin_object() {
  expect('{');
  if (started_.size() >= MAX_DEPTH) fail("nesting deeper than " + std::to_string(MAX_DEPTH - 1));
  started_.push_back(false);
}

bool Reader::next_key(std::string& key) {
  if (started_.empty()) fail("next_key outside an object");
  if (peek_char() == '}') {
    ++pos_;
    started_.pop_back();
    return false;
  }
  if (started_.back()) expect(',');
  started_.back() = true;
  if (peek_char() != '"') fail("expected a key string");
  key.clear();
  read_string_into(key);
  expect(':');
  return true;
}

void Reader::begin_array() {
  expect('[');
  if (started_.size() >= MAX_DEPTH) fail("nesting deeper than " + std::to_string(MAX_DEPTH - 1));
  started_.push_back(false);
}

bool Reader::next_element() {
  if (started_.empty()) fail("next_element outside an array");
  if (peek_char() == ']') {
    ++pos_;
    started_.pop_back();
    return false;
  }
  if (started_.back()) expect(',');
  started_.back() = true;
  return true;
}

Value Reader::read_value() {
  Value value;
  value.type = peek();
  switch (value.type) {
    case Type::Null: read_null(); break;
    case Type::Bool: value.boolean = read_bool(); break;
    case Type::Number: value.number = read_number(); break;
    case Type::String: read_string_into(value.string); break;
    case Type::Array:
      begin_array();
      while (next_element()) value.array.push_back(read_value());
      break;
    case Type::Object: {
      begin_object();
      std::string key;
      while (next_key(key)) {
        if (value.object.count(key)) fail("duplicate key \"" + key + "\"");
        value.object.emplace(key, read_value());
      }
      break;
    }
  }
  return value;
}

void Reader::skip_value() {
  switch (peek()) {
    case Type::Null: read_null(); break;
    case Type::Bool: read_bool(); break;
    case Type::Number: read_number(); break;
    case Type::String: {
      std::string ignored;
      read_string_into(ignored);
      break;
    }
    case Type::Array:
      begin_array();
      while (next_element()) skip_value();
      break;
    case Type::Object: {
      begin_object();
      std::string key;
      while (next_key(key)) skip_value();
      break;
    }
  }
}

void Reader::expect_end() {
  skip_ws();
  if (pos_ != text_.size()) fail("unexpected data after the document");
}

Value parse(const std::string& text, const std::string& origin) {
  Reader reader(text, origin);
  Value value = reader.read_value();
  reader.expect_end();
  return value;
}

}  // namespace json
}  // namespace es
