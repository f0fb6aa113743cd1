// utf8.h - UTF-8 decoding, validation and the lossy conversion `tokenizers` uses on decode.

#ifndef ES_TOKENIZER_UTF8_H
#define ES_TOKENIZER_UTF8_H

#include <cstddef>
#include <string>
#include <vector>

namespace es {
namespace utf8 {

void append(std::string& out, char32_t cp);
std::string encode(char32_t cp);

// Length of the well-formed UTF-8 sequence starting at text[pos], or 0 when it is not well-formed
// (overlong forms, surrogates and code points above U+10FFFF are ill-formed).
size_t valid_sequence_length(const std::string& text, size_t pos);

// Byte offset of the first ill-formed sequence, or std::string::npos when `text` is valid UTF-8.
size_t find_invalid(const std::string& text);

// Code points of a valid UTF-8 string (call find_invalid first).
std::vector<char32_t> decode(const std::string& text);

// Bytes -> text where each maximal ill-formed subpart becomes U+FFFD (the Unicode "substitution of
// maximal subparts" practice; what Rust's String::from_utf8_lossy does).
std::string lossy(const std::string& bytes);

// For streaming: how many bytes at the end of `bytes` are a proper prefix of a well-formed sequence
// (an incomplete character that more bytes may complete). 0..3.
size_t incomplete_tail(const std::string& bytes);

}  // namespace utf8
}  // namespace es

#endif  // ES_TOKENIZER_UTF8_H
