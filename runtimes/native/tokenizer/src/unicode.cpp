// unicode.cpp - binary search over the generated range tables (tools/gen_unicode_tables.py).

#include "unicode.h"

#include <algorithm>
#include <iterator>

namespace es {
namespace unicode {

namespace {

struct CodeRange {
  char32_t first, last;
};

#include "unicode_tables.inc"

template <size_t N>
bool in(const CodeRange (&table)[N], char32_t cp) {
  auto it = std::upper_bound(std::begin(table), std::end(table), cp,
                             [](char32_t value, const CodeRange& range) { return value < range.first; });
  return it != std::begin(table) && cp <= std::prev(it)->last;
}

}  // namespace

bool is_letter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in(kLetter, cp);
}

bool is_number(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in(kNumber, cp);
}

bool is_space(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return in(kSpace, cp);
}

bool is_numeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in(kNumeric, cp);
}

}  // namespace unicode
}  // namespace es
