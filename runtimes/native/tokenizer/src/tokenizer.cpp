// tokenizer.cpp - encode / decode / streaming over the loaded components (see es_tokenizer.h).

#include <cstdio>

#include "impl.h"
#include "utf8.h"

namespace es {

void Tokenizer::Impl::check_id(int32_t id, const char* where) const {
  if (id < 0 || size_t(id) >= present.size() || !present[size_t(id)])
    throw TokenizerError(std::string(where) + ": token id " + std::to_string(id) + " is not in the vocabulary of " +
                         origin + " (ids 0.." + std::to_string(int64_t(present.size()) - 1) +
                         "); the ids come from a different model than this tokenizer");
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(const std::string& utf8) const {
  size_t bad = utf8::find_invalid(utf8);
  if (bad != std::string::npos) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(utf8[bad]));
    throw TokenizerError("encode: the text is not valid UTF-8 (byte " + std::to_string(bad) + " is " + byte +
                         "); pass UTF-8 text (convert it from its encoding first)");
  }
  const Impl& impl = *impl_;
  std::vector<int32_t> ids;
  for (const auto& part : impl.added.split(utf8, false)) {
    if (part.second >= 0) {
      ids.push_back(part.second);
      continue;
    }
    std::string normalized = impl.normalizer.apply(part.first);
    for (const auto& piece : impl.added.split(normalized, true)) {
      if (piece.second >= 0) {
        ids.push_back(piece.second);
        continue;
      }
      for (const std::string& word : impl.pre_tokenizer.apply(piece.first)) impl.model.encode_word(word, ids);
    }
  }
  return ids;
}

std::vector<int32_t> Tokenizer::encode(const std::string& utf8, bool add_bos) const {
  std::vector<int32_t> ids = encode(utf8);
  if (add_bos && impl_->bos_id >= 0 && (ids.empty() || ids[0] != impl_->bos_id)) ids.insert(ids.begin(), impl_->bos_id);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    impl.check_id(id, "decode");
    if (skip_special && impl.special[size_t(id)]) continue;
    tokens.push_back(impl.id_to_token[size_t(id)]);
  }
  return impl.decoder.decode(std::move(tokens));
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->present.size()); }

int32_t Tokenizer::token_id(const std::string& token) const {
  auto added = impl_->added_ids.find(token);
  if (added != impl_->added_ids.end()) return added->second;
  return impl_->model.find(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  impl_->check_id(id, "id_to_token");
  return impl_->id_to_token[size_t(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  impl_->check_id(id, "is_special");
  return impl_->special[size_t(id)] != 0;
}

int32_t Tokenizer::bos_id() const { return impl_->bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->eos_id; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos_token; }
const std::string& Tokenizer::family() const { return impl_->family; }

// ---- streaming -----------------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  const Tokenizer::Impl& impl = tokenizer_->impl();
  impl.check_id(id, "StreamDecoder::push");
  if (skip_special_ && impl.special[size_t(id)]) return "";
  std::string bytes = impl.decoder.token_bytes(impl.id_to_token[size_t(id)], at_start_);
  if (bytes.empty()) return "";
  at_start_ = false;
  pending_ += bytes;
  size_t tail = utf8::incomplete_tail(pending_);
  std::string out = utf8::lossy(pending_.substr(0, pending_.size() - tail));
  pending_.erase(0, pending_.size() - tail);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8::lossy(pending_);
  reset();
  return out;
}

void StreamDecoder::reset() {
  pending_.clear();
  at_start_ = true;
}

}  // namespace es
