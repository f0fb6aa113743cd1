// es_tokenizer_unit - checks of the pieces the differential test cannot reach: the strict JSON reader,
// UTF-8 edge cases, refusals of unsupported tokenizer.json components, chat forms. Exit 0 when all pass.

#include <iostream>
#include <string>

#include "es_tokenizer.h"
#include "json.h"
#include "utf8.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::cerr << "FAIL: " << what << "\n";
  }
}

// True when `f` throws a TokenizerError whose message contains `needle`.
template <typename F>
bool throws_with(F f, const std::string& needle) {
  try {
    f();
  } catch (const es::TokenizerError& err) {
    if (std::string(err.what()).find(needle) != std::string::npos) return true;
    std::cerr << "  (message was: " << err.what() << ")\n";
    return false;
  }
  return false;
}

void json_is_strict() {
  for (const char* bad : {"[1,]", "{\"a\":1,}", "[01]", "[1.]", "[NaN]", "\"\\ud800\"", "\"\\udc00\"", "[1] x",
                          "{\"a\":1,\"a\":2}", "\"a\nb\"", "// c\n1", "'a'", "[\"\\x\"]", "\"\xC0\x80\""}) {
    check(throws_with([&] { es::json::parse(bad, "t.json"); }, "invalid JSON"), std::string("rejects ") + bad);
  }
  es::json::Value v = es::json::parse("{\"a\": [1, -2.5e3, true, null, \"\\u00e9\\ud83d\\ude00\"]}", "t.json");
  check(v.find("a")->array[1].number == -2500.0, "number");
  check(v.find("a")->array[4].string == "\xC3\xA9\xF0\x9F\x98\x80", "escapes and surrogate pairs");
}

void utf8_edges() {
  using es::utf8::lossy;
  const std::string r = "\xEF\xBF\xBD";
  check(lossy("a\x80z") == "a" + r + "z", "lone continuation byte");
  check(lossy("\xE2\x82z") == r + "z", "cut 3-byte sequence is one U+FFFD");
  check(lossy("\xF0\x9F\x98") == r, "cut 4-byte sequence at the end");
  check(lossy("\xED\xA0\x80") == r + r + r, "surrogate: three U+FFFD");
  check(lossy("\xC0\xAF") == r + r, "overlong: two U+FFFD");
  check(lossy("\xF4\x90\x80\x80") == r + r + r + r, "above U+10FFFF");
  check(es::utf8::incomplete_tail("a\xF0\x9F\x98") == 3, "tail of 3");
  check(es::utf8::incomplete_tail("a\xE2") == 1, "tail of 1");
  check(es::utf8::incomplete_tail("a\xE2\x28") == 0, "broken is not incomplete");
  check(es::utf8::incomplete_tail("\xC3\xA9") == 0, "complete");
  check(es::utf8::find_invalid("ok\xFF") == 2, "find_invalid offset");
}

std::string tokenizer_json(const std::string& model, const std::string& pre, const std::string& decoder) {
  return "{\"version\": \"1.0\", \"added_tokens\": [], \"normalizer\": null, \"pre_tokenizer\": " + pre +
         ", \"post_processor\": null, \"decoder\": " + decoder + ", \"model\": " + model + "}";
}

void refusals() {
  const std::string bpe = "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}";
  const std::string byte_level = "{\"type\": \"ByteLevel\"}";
  auto load = [](const std::string& json) { es::Tokenizer::from_json(json, "", "x/tokenizer.json"); };
  check(throws_with([&] { load(tokenizer_json("{\"type\": \"WordPiece\", \"vocab\": {}}", byte_level, byte_level)); },
                    "model \"WordPiece\" is not supported"), "refuses WordPiece");
  check(throws_with([&] { load(tokenizer_json(bpe, "{\"type\": \"Whitespace\"}", byte_level)); },
                    "pre_tokenizer \"Whitespace\" is not supported"), "refuses Whitespace");
  check(throws_with([&] { load(tokenizer_json(bpe, byte_level, "{\"type\": \"WordPiece\"}")); },
                    "decoder \"WordPiece\" is not supported"), "refuses a WordPiece decoder");
  check(throws_with([&] {
          load(tokenizer_json(bpe, "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s\"}, \"behavior\": \"Isolated\"}",
                              byte_level));
        }, "with a Regex pattern is not supported"), "refuses a regex Split");
  check(throws_with([&] { load("{\"model\": " + bpe + ", \"normalizer\": {\"type\": \"NFKC\"}, \"decoder\": null}"); },
                    "normalizer \"NFKC\" is not supported"), "refuses NFKC");
  check(throws_with([] { es::Tokenizer::from_folder("/nonexistent"); }, "tokenizer.json is missing"), "missing file");

  es::Tokenizer tok = es::Tokenizer::from_json(tokenizer_json(bpe, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}",
                                                              byte_level));
  check(tok.encode("ab") == std::vector<int32_t>{2}, "merge");
  check(throws_with([&] { tok.encode("a\xFF"); }, "not valid UTF-8 (byte 1 is 0xFF)"), "invalid UTF-8 encode");
  check(throws_with([&] { tok.decode({7}); }, "token id 7 is not in the vocabulary"), "bad id");
}

void streaming_holds_back_incomplete_characters() {
  const std::string model =
      "{\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {\"<0xE2>\": 0, \"<0x82>\": 1, \"<0xAC>\": 2, "
      "\"\u2581a\": 3, \"<0xFF>\": 4}, \"merges\": []}";
  const std::string decoder =
      "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\u2581\"}, "
      "\"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}";
  es::Tokenizer tok = es::Tokenizer::from_json(tokenizer_json(model, "null", decoder));
  check(tok.family() == "sentencepiece_bpe", "sentencepiece family");
  es::StreamDecoder stream(tok);
  check(stream.push(3) == " a", "plain token");
  check(stream.push(0).empty() && stream.push(1).empty(), "first two bytes of the euro sign are held back");
  check(stream.push(2) == "\xE2\x82\xAC", "the euro sign once complete");
  check(stream.push(0).empty(), "a new incomplete character");
  check(stream.push(3) == "\xEF\xBF\xBD a", "broken by a plain token: U+FFFD");
  check(stream.push(4) == "\xEF\xBF\xBD", "a byte that never starts a character: U+FFFD at once");
  check(stream.push(0).empty() && stream.finish() == "\xEF\xBF\xBD", "finish() flushes the held-back bytes");
  check(tok.decode({0, 1, 2, 3}) == "\xE2\x82\xAC a", "decode");
  check(tok.decode({0, 1, 3}) == "\xEF\xBF\xBD\xEF\xBF\xBD a", "byte fallback: one U+FFFD per byte of a bad run");
}

void chat_forms() {
  std::vector<es::ChatMessage> chat = {{"user", "Hi"}};
  check(es::format_chat(es::chat_format("chatml", "Sys"), chat) ==
            "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "chatml with a default system prompt");
  check(es::format_chat(es::chat_format("chatml"), {{"system", "S"}, {"user", "Hi"}}, false) ==
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
        "chatml with its own system message");
  check(es::format_chat(es::chat_format("gemma", "", "<bos>"),
                        {{"system", " Be brief. "}, {"user", "Hi\n"}, {"assistant", "Hello."}, {"user", "Bye"}}) ==
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
        "gemma");
  check(throws_with([] { es::chat_format("llama3"); }, "chat format \"llama3\" is not supported"), "unknown form");
  check(throws_with([] { es::format_chat(es::chat_format("chatml"), {{"tool", "x"}}); }, "role \"tool\""), "bad role");
}

}  // namespace

int main() {
  json_is_strict();
  utf8_edges();
  refusals();
  streaming_holds_back_incomplete_characters();
  chat_forms();
  if (failures) {
    std::cerr << failures << " check(s) failed\n";
    return 1;
  }
  std::cout << "es_tokenizer_unit: all checks passed\n";
  return 0;
}
