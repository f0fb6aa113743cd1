// unicode.h - the character classes the byte-level pre-tokenizer and the Digits pre-tokenizer use.

#ifndef ES_TOKENIZER_UNICODE_H
#define ES_TOKENIZER_UNICODE_H

namespace es {
namespace unicode {

bool is_letter(char32_t cp);   // \p{L} in the GPT-2 regex
bool is_number(char32_t cp);   // \p{N} in the GPT-2 regex
bool is_space(char32_t cp);    // \s in the GPT-2 regex (Unicode White_Space)
bool is_numeric(char32_t cp);  // what the Digits pre-tokenizer isolates (Rust's char::is_numeric)

}  // namespace unicode
}  // namespace es

#endif  // ES_TOKENIZER_UNICODE_H
