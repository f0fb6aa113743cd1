// text.h - prompt text <-> token ids for the runner: the bundle's tokenizer (runtimes/native/tokenizer, built in when
// CMake finds it: ES_HAVE_TOKENIZER) and the chat form of its template. Without it, open() refuses with the fix
// (pass token ids), and everything else in the runner works on ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "manifest.h"

namespace es {

class TextStream {  // streaming decode: complete UTF-8 only, the tail held back until the next push
 public:
  virtual ~TextStream() = default;
  virtual std::string push(int32_t id) = 0;
  virtual std::string finish() = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Throws Error(Code::Bundle) when the tokenizer cannot be loaded (or was not built in).
  static std::unique_ptr<TextCodec> open(const std::string& folder, const Manifest& manifest);
  static bool available();  // built with the tokenizer
  // A user prompt -> ids, through the bundle's chat form when `chat` (as edge_spec.loading.tokenizer.encode_prompt).
  // Throws Error(Code::Encoding) for invalid UTF-8 (naming `where` and the byte), Code::Argument for chat without
  // a known chat form.
  virtual std::vector<int64_t> encode_prompt(const std::string& utf8, bool chat, const std::string& where) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;  // special tokens skipped
  virtual std::unique_ptr<TextStream> stream() const = 0;
};

}  // namespace es
