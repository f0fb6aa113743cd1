// components.h - the pipeline stages a tokenizer.json declares, each read from its JSON and refusing
// anything it does not implement:  added tokens -> normalizer -> pre-tokenizer -> BPE model;
// ids -> token strings -> decoder.

#ifndef ES_TOKENIZER_COMPONENTS_H
#define ES_TOKENIZER_COMPONENTS_H

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "json.h"
#include "token_index.h"

namespace es {

// Throws TokenizerError: "<origin>: <component> <what> is not supported (<supported>); ..."
[[noreturn]] void unsupported(const std::string& origin, const std::string& component, const std::string& what,
                              const std::string& supported);

// The "type" string of a component object (throws when missing).
const std::string& type_of(const json::Value& config, const std::string& origin, const std::string& component);

// Reads a {"String": "..."} pattern; a {"Regex": ...} pattern is refused.
std::string string_pattern(const json::Value& config, const std::string& origin, const std::string& component);

// ---- normalizer: Replace (string pattern), Prepend, Sequence of those, or none ----------------------
class Normalizer {
 public:
  void load(const json::Value& config, const std::string& origin);
  std::string apply(const std::string& text) const;
  bool empty() const { return steps_.empty(); }

 private:
  struct Step {
    bool prepend;  // else: replace
    std::string pattern, content;
  };
  void add(const json::Value& config, const std::string& origin);
  std::vector<Step> steps_;
};

// ---- how a split treats the matched parts (tokenizers' SplitDelimiterBehavior) ----------------------
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct Segment {
  size_t begin, end;
  bool match;
};

// Applies `behavior` to segments covering a piece; returns the non-empty [begin, end) ranges kept.
std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<Segment>& segments, SplitBehavior behavior);

// ---- pre-tokenizer: ByteLevel, Digits, Split (string pattern), Sequence of those, or none -----------
class PreTokenizer {
 public:
  void load(const json::Value& config, const std::string& origin);
  // One normalized text segment -> the words the model encodes one by one.
  std::vector<std::string> apply(const std::string& text) const;
  bool has_byte_level() const;

 private:
  enum class Kind { ByteLevel, Digits, Split };
  struct Step {
    Kind kind;
    bool flag = false;  // ByteLevel: use_regex; Digits: individual_digits
    bool add_prefix_space = false;
    std::string pattern;
    SplitBehavior behavior = SplitBehavior::Isolated;
  };
  void add(const json::Value& config, const std::string& origin);
  void run(const Step& step, const std::string& piece, std::vector<std::string>& out) const;
  std::vector<Step> steps_;
};

// The GPT-2 byte <-> unicode-character map (bytes that are printable map to themselves).
const std::string& byte_to_char(unsigned char byte);       // UTF-8 of the mapped character
int char_to_byte(char32_t cp);                              // -1 when `cp` is not a mapped character

// GPT-2's regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ as segments.
std::vector<Segment> gpt2_split(const std::string& text);

// ---- the BPE model ---------------------------------------------------------------------------------
class Bpe {
 public:
  // `tokens` by id (`present` marks the ids in use) and `merges` (pairs of tokens, in rank order) as read
  // from the model object.
  void load(std::vector<std::string> tokens, std::vector<unsigned char> present,
            const std::vector<std::pair<std::string, std::string>>& merges, const json::Value& options,
            const std::string& origin);
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;
  int32_t find(std::string_view token) const { return index_.find(token); }  // -1 when absent
  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::vector<unsigned char>& present() const { return present_; }

 private:
  // The merges: (left id, right id) -> (rank, merged id), a flat open-addressing table.
  struct Merge {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t id = -1;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  const Merge* find_merge(int32_t a, int32_t b) const;
  void add_merge(int32_t a, int32_t b, uint32_t rank, int32_t id);
  void initial_symbols(const std::string& word, std::vector<int32_t>& symbols) const;

  std::vector<std::string> tokens_;
  std::vector<unsigned char> present_;
  TokenIndex index_;
  std::vector<Merge> merges_;
  uint64_t merge_mask_ = 0;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xNN> tokens for byte fallback (-1 when absent)
};

// ---- decoder: ByteLevel, or a Sequence of Replace (string pattern), ByteFallback, Fuse, Strip ------
class Decoder {
 public:
  void load(const json::Value& config, const std::string& origin);
  // tokenizers' decode_chain over the whole token list, joined.
  std::string decode(std::vector<std::string> tokens) const;
  // For streaming: the bytes one token adds (byte-fallback tokens give their raw byte, no UTF-8 check);
  // `at_start` when nothing has been produced yet (a Strip after Fuse applies to the text's start only).
  std::string token_bytes(const std::string& token, bool at_start) const;
  bool byte_level() const { return byte_level_; }
  bool byte_fallback() const;

 private:
  enum class Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip };
  struct Step {
    Kind kind;
    std::string pattern, content;  // Replace; Strip's content character
    size_t start = 0, stop = 0;    // Strip
  };
  void add(const json::Value& config, const std::string& origin);
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

// ---- added tokens, matched in the text before anything else (leftmost, then longest) --------------
struct AddedToken {
  int32_t id;
  std::string content;
  bool special, normalized;
};

class AddedTokens {
 public:
  void load(const json::Value& list, const std::string& origin);
  void prepare(const Normalizer& normalizer);  // builds the two match tables once the normalizer is known
  // Splits `text` at the tokens of one table: (text, -1) for plain parts, ("", id) for a token.
  std::vector<std::pair<std::string, int32_t>> split(const std::string& text, bool normalized) const;
  bool has_normalized() const { return !normalized_.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie over the token texts; node 0 is the root.
  struct Trie {
    struct Node {
      std::unordered_map<unsigned char, int32_t> next;
      int32_t id = -1;
    };
    std::vector<Node> nodes{1};
    bool empty() const { return nodes.size() == 1; }
    void insert(const std::string& text, int32_t id);
    size_t longest_at(const std::string& text, size_t pos, int32_t& id) const;  // 0: no token starts here
  };
  std::vector<AddedToken> tokens_;
  Trie raw_, normalized_;
};

}  // namespace es

#endif  // ES_TOKENIZER_COMPONENTS_H
