// es_tokenizer.h - the bundle's tokenizer in C++17, no dependencies beyond the standard library.
//
// Reads a Hugging Face `tokenizer.json` (+ `tokenizer_config.json` for bos/eos and add_bos_token) and
// encodes / decodes exactly like the `tokenizers` library for the two families edge-spec ships:
//   * byte-level BPE (GPT-2 style; SmolLM2): ByteLevel pre-tokenizer (GPT-2 regex), optional Digits split,
//     byte<->unicode map, ranked merges, ByteLevel decoder;
//   * SentencePiece-style BPE with byte fallback (Gemma): "▁" for spaces (Replace / Prepend normalizers,
//     Split pre-tokenizer on a string), `<0xNN>` byte-fallback tokens, ranked merges,
//     Replace/ByteFallback/Fuse/Strip decoder.
// Added tokens (special or not) are matched in the text before the model runs, as `tokenizers` does.
// Anything else a tokenizer.json declares is refused at load time with a TokenizerError naming it.
//
// Errors are thrown as es::TokenizerError (a std::runtime_error); the message says what is wrong and
// the fix. The C API (edge_spec.h) is expected to catch them and turn them into codes + messages.
//
// Thread safety: a loaded Tokenizer is immutable; encode/decode may be called from many threads.
// A StreamDecoder is single-threaded state over one Tokenizer (which must outlive it).

#ifndef ES_TOKENIZER_H
#define ES_TOKENIZER_H

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace es {

class TokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ChatFormat;  // below

class Tokenizer {
 public:
  // Loads `<folder>/tokenizer.json` and, when present, `<folder>/tokenizer_config.json`.
  static Tokenizer from_folder(const std::string& folder);
  // Same from in-memory JSON texts; `config_json` may be empty. `origin` names the source in errors.
  static Tokenizer from_json(const std::string& tokenizer_json, const std::string& config_json = "",
                             const std::string& origin = "tokenizer.json");

  // Plain text -> ids, like `tokenizers`' encode(text, add_special_tokens=False): added/special token
  // strings in `text` map to their ids (chat templates rely on it); no BOS/EOS is added.
  // Throws TokenizerError if `utf8` is not valid UTF-8 (the message gives the byte offset).
  std::vector<int32_t> encode(const std::string& utf8) const;

  // encode() with the BOS id put in front when `add_bos` and the text did not already start with it.
  std::vector<int32_t> encode(const std::string& utf8, bool add_bos) const;

  // A user prompt -> ids, like edge_spec.loading.tokenizer.Tokenizer.encode_prompt: with `chat` (not null) the prompt
  // becomes one user turn of that form plus the generation prompt, encoded without adding BOS (the form
  // carries it where the model wants it); without, encode(prompt, add_bos_token()).
  std::vector<int32_t> encode_prompt(const std::string& prompt, const ChatFormat* chat = nullptr) const;

  // ids -> text, like `tokenizers`' decode(ids, skip_special_tokens). Undecodable bytes become U+FFFD
  // exactly as `tokenizers` does. Throws TokenizerError for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const;

  int32_t vocab_size() const;                    // model vocab + added tokens (highest id + 1)
  int32_t token_id(const std::string& token) const;  // -1 when the token does not exist
  std::string id_to_token(int32_t id) const;     // the raw vocabulary string; throws for a bad id
  bool is_special(int32_t id) const;             // an added token marked "special"

  // From tokenizer_config.json ("bos_token"/"eos_token", as a string or {"content": ...}); -1 if none.
  int32_t bos_id() const;
  int32_t eos_id() const;
  bool add_bos_token() const;                    // tokenizer_config.json "add_bos_token" (default false)

  // "byte_level_bpe" or "sentencepiece_bpe".
  const std::string& family() const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming decode: feed generated ids one at a time, get back only complete UTF-8. Bytes of a character
// that is not finished yet are held back until the next push(); bytes that can never become valid UTF-8
// come out as U+FFFD. Concatenating every push() and the final finish() equals tokenizer.decode(all ids)
// whenever that decoded text is valid UTF-8 without replacement characters.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  std::string push(int32_t id);
  std::string finish();  // the held-back tail (as U+FFFD) and a reset, for the end of a stream
  void reset();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  bool at_start_ = true;   // decoders that strip the text's first leading space only do so once
  std::string pending_;    // bytes of an incomplete UTF-8 sequence
};

// ---- chat formatting: the concrete forms of the chat templates our bundles carry -------------------
//
// The bundles' Jinja templates are not run in C++. The exporter detects which simple form a template
// renders (edge_spec/loading/chat_format.py) and writes its name and default system prompt into the manifest:
//   "chatml": [<|im_start|>system\n{default_system}<|im_end|>\n  - only when the first message is not a
//              system message and default_system is not empty (SmolLM2 has one)]
//             <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
//   "gemma":  {bos}<start_of_turn>user\n{trimmed system + "\n\n", when a system message came before}
//             {content, trimmed}<end_of_turn>\n ... ("assistant" is written "model") [<start_of_turn>model\n]
//             (the template edge_spec/loading/gguf_gemma3.py writes; Google's renders the same for usual chats)
// The rendered text is then encoded with encode(text) (its special-token strings become their ids).
struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;
};

struct ChatFormat {
  std::string name;            // "chatml" or "gemma"
  std::string default_system;  // chatml only; "" for none
  std::string bos_token;       // gemma only: the text put first ("<bos>")
};

// Checks the name (throws TokenizerError naming the supported forms when unknown).
ChatFormat chat_format(const std::string& name, const std::string& default_system = "",
                       const std::string& bos_token = "");

// The prompt text for `messages`; throws TokenizerError for a role the form does not allow.
std::string format_chat(const ChatFormat& format, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt = true);

}  // namespace es

#endif  // ES_TOKENIZER_H
