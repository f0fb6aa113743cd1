// text.cpp - see text.h.
#include "text.h"

#include "errors.h"

#ifdef ES_HAVE_TOKENIZER
#include "es_tokenizer.h"
#endif

namespace es {

#ifndef ES_HAVE_TOKENIZER

bool TextCodec::available() { return false; }

std::unique_ptr<TextCodec> TextCodec::open(const std::string& folder, const Manifest&) {
  throw bundle_error("this edge-spec-run was built without the C++ tokenizer, so it cannot encode text for " + folder,
                     "pass token ids with --prompt-ids, or rebuild with runtimes/native/tokenizer present (make native)");
}

#else

namespace {

// The chat form of the bundle's template: what the exporter wrote into the manifest (edge_spec/loading/chat_format.py
// ChatFormat.manifest(): {"chat_format": name, "default_system", "bos_token"}, under "tokenizer" or at the top, or
// "chat_format" as an object of those fields), else recognised from the Jinja text.
ChatFormat chat_form(const Manifest& m, const Tokenizer& tok) {
  auto text = [](const Json& j, const char* key) { return j.get(key).is_string() ? j.get(key).as_string() : ""; };
  const std::string bos = tok.bos_id() >= 0 ? tok.id_to_token(tok.bos_id()) : "<bos>";
  for (const Json* where : {&m.raw.get("tokenizer"), &m.raw}) {
    const Json& written = where->get("chat_format");
    const Json* fields = written.is_object() ? &written : where;
    std::string name = written.is_string() ? written.as_string() : text(written, "chat_format");
    if (written.is_object() && name.empty()) name = text(written, "name");
    if (name.empty()) continue;
    const std::string written_bos = text(*fields, "bos_token");
    return chat_format(name, text(*fields, "default_system"), written_bos.empty() && name == "gemma" ? bos : written_bos);
  }
  const std::string& t = m.chat_template;
  if (t.find("<|im_start|>") != std::string::npos) {
    std::string system;  // a literal default system turn, as SmolLM2's template writes one
    const std::string open = "<|im_start|>system\n";
    size_t at = t.find(open);
    if (at != std::string::npos) {
      size_t end = t.find("<|im_end|>", at + open.size());
      if (end != std::string::npos) {
        std::string s = t.substr(at + open.size(), end - at - open.size());
        if (s.find("{{") == std::string::npos && s.find("{%") == std::string::npos) system = s;
      }
    }
    return chat_format("chatml", system);
  }
  if (t.find("<start_of_turn>") != std::string::npos)
    return chat_format("gemma", "", bos);
  throw config_error("this bundle's chat template is not one of the forms the native runner renders (chatml, gemma)",
                     "drop --chat and pass the formatted prompt, or run it with the Python runtime (edge-spec generate)");
}

class Stream : public TextStream {
 public:
  explicit Stream(const Tokenizer& tok) : d_(tok) {}
  std::string push(int32_t id) override { return d_.push(id); }
  std::string finish() override { return d_.finish(); }

 private:
  StreamDecoder d_;
};

class Codec : public TextCodec {
 public:
  Codec(Tokenizer tok, const Manifest& m) : tok_(std::move(tok)), manifest_(m) {}

  std::vector<int64_t> encode_prompt(const std::string& utf8, bool chat, const std::string& where) const override {
    std::vector<int32_t> ids;
    try {
      if (chat) {
        if (manifest_.chat_template.empty())
          throw config_error("this model has no chat template", "drop --chat and pass a plain prompt");
        ids = tok_.encode(format_chat(chat_form(manifest_, tok_), {{"user", utf8}}), false);
      } else {
        ids = tok_.encode(utf8, tok_.add_bos_token());
      }
    } catch (const TokenizerError& err) {
      throw Error(Code::Encoding, "the prompt on " + where + " could not be encoded: " + err.what(),
                  "pass UTF-8 text, e.g. convert it with `iconv -t UTF-8`");
    }
    return std::vector<int64_t>(ids.begin(), ids.end());
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    return tok_.decode(std::vector<int32_t>(ids.begin(), ids.end()), true);
  }

  std::unique_ptr<TextStream> stream() const override { return std::unique_ptr<TextStream>(new Stream(tok_)); }

 private:
  Tokenizer tok_;
  Manifest manifest_;
};

}  // namespace

bool TextCodec::available() { return true; }

std::unique_ptr<TextCodec> TextCodec::open(const std::string& folder, const Manifest& m) {
  try {
    return std::unique_ptr<TextCodec>(new Codec(Tokenizer::from_folder(folder), m));
  } catch (const TokenizerError& err) {
    throw bundle_error(err.what(),  // names tokenizer.json itself
                       "pass token ids (--prompt-ids, es_generate_ids), or run the bundle with the Python runtime");
  }
}

#endif

}  // namespace es
