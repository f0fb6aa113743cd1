// utf8.cpp - see utf8.h. The well-formedness rules are Table 3-7 of the Unicode Standard.

#include "utf8.h"

namespace es {
namespace utf8 {

namespace {

// Expected total length for a lead byte (0 for a byte that cannot start a sequence), and the allowed
// range of the second byte (the later bytes are always 0x80..0xBF).
struct Lead {
  int length;
  unsigned char low, high;
};

Lead lead_of(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// How many bytes from `pos` form a valid prefix of a sequence (1 for an ASCII byte, the full length
// for a complete sequence, fewer for a cut / broken one; 0 for a byte that cannot start one). Sets
// `complete` when the whole sequence is there.
size_t valid_prefix(const std::string& text, size_t pos, bool& complete) {
  unsigned char b = static_cast<unsigned char>(text[pos]);
  Lead lead = lead_of(b);
  complete = false;
  if (lead.length == 0) return 0;
  if (lead.length == 1) {
    complete = true;
    return 1;
  }
  size_t n = 1;
  for (int i = 1; i < lead.length; ++i) {
    if (pos + n >= text.size()) return n;
    unsigned char c = static_cast<unsigned char>(text[pos + n]);
    unsigned char low = i == 1 ? lead.low : 0x80, high = i == 1 ? lead.high : 0xBF;
    if (c < low || c > high) return n;
    ++n;
  }
  complete = true;
  return n;
}

}  // namespace

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string encode(char32_t cp) {
  std::string out;
  append(out, cp);
  return out;
}

size_t valid_sequence_length(const std::string& text, size_t pos) {
  bool complete = false;
  size_t n = valid_prefix(text, pos, complete);
  return complete ? n : 0;
}

size_t find_invalid(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t n = valid_sequence_length(text, pos);
    if (n == 0) return pos;
    pos += n;
  }
  return std::string::npos;
}

std::vector<char32_t> decode(const std::string& text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    unsigned char b = static_cast<unsigned char>(text[pos]);
    size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
    out.push_back(cp);
    pos += n;
  }
  return out;
}

std::string lossy(const std::string& bytes) {
  static const std::string replacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete = false;
    size_t n = valid_prefix(bytes, pos, complete);
    if (complete) {
      out.append(bytes, pos, n);
      pos += n;
    } else {
      out += replacement;  // one U+FFFD for the maximal subpart (at least the one bad byte)
      pos += n == 0 ? 1 : n;
    }
  }
  return out;
}

size_t incomplete_tail(const std::string& bytes) {
  // A sequence is at most 4 bytes: look for its lead byte among the last 3.
  size_t size = bytes.size();
  for (size_t back = 1; back <= 3 && back <= size; ++back) {
    size_t pos = size - back;
    unsigned char b = static_cast<unsigned char>(bytes[pos]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: the lead is further back
    bool complete = false;
    size_t n = valid_prefix(bytes, pos, complete);
    return (!complete && n == back && lead_of(b).length > int(back)) ? back : 0;
  }
  return 0;
}

}  // namespace utf8
}  // namespace es
