// chat.cpp - the two chat forms our bundles' templates render (see es_tokenizer.h and
// edge_spec/loading/chat_format.py, which detects the form from a bundle's Jinja template).

#include "es_tokenizer.h"
#include "utf8.h"

namespace es {

namespace {

// Python's str.isspace() for the code points it is true of (Jinja's `trim` is str.strip()).
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Jinja's `trim`: leading and trailing whitespace removed.
std::string trim(const std::string& text) {
  if (utf8::find_invalid(text) != std::string::npos)
    throw TokenizerError("chat: a message is not valid UTF-8; pass UTF-8 text");
  std::vector<char32_t> cps = utf8::decode(text);
  size_t begin = 0, end = cps.size();
  while (begin < end && python_space(cps[begin])) ++begin;
  while (end > begin && python_space(cps[end - 1])) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) utf8::append(out, cps[i]);
  return out;
}

std::string chatml(const ChatFormat& format, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (i == 0 && message.role != "system" && !format.default_system.empty())
      out += "<|im_start|>system\n" + format.default_system + "<|im_end|>\n";
    out += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// As the template edge_spec/loading/gguf_gemma3.py writes (GEMMA_TURN_TEMPLATE): a system message is trimmed and put,
// with a blank line, in front of the next turn; "assistant" turns are written "model"; contents are trimmed.
// (Google's Gemma 3 template renders the same text for a leading system message and alternating turns.)
std::string gemma(const ChatFormat& format, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out = format.bos_token;
  std::string system_prefix;
  for (const ChatMessage& message : messages) {
    if (message.role == "system") {
      system_prefix = trim(message.content) + "\n\n";
      continue;
    }
    std::string role = message.role == "assistant" ? "model" : message.role;
    out += "<start_of_turn>" + role + "\n" + system_prefix + trim(message.content) + "<end_of_turn>\n";
    system_prefix.clear();
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace

ChatFormat chat_format(const std::string& name, const std::string& default_system, const std::string& bos_token) {
  if (name != "chatml" && name != "gemma")
    throw TokenizerError("chat format \"" + name + "\" is not supported (supported: chatml, gemma); re-export the "
                         "bundle so its manifest names one of them, or run without chat");
  return ChatFormat{name, default_system, bos_token};
}

std::string format_chat(const ChatFormat& format, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  for (const ChatMessage& message : messages)
    if (message.role != "system" && message.role != "user" && message.role != "assistant")
      throw TokenizerError("chat: role \"" + message.role + "\" is not supported (system, user, assistant)");
  if (format.name == "chatml") return chatml(format, messages, add_generation_prompt);
  if (format.name == "gemma") return gemma(format, messages, add_generation_prompt);
  return chat_format(format.name).name;  // throws for an unknown name
}

std::vector<int32_t> Tokenizer::encode_prompt(const std::string& prompt, const ChatFormat* chat) const {
  if (chat == nullptr) return encode(prompt, add_bos_token());
  return encode(format_chat(*chat, {ChatMessage{"user", prompt}}, true));
}

}  // namespace es
