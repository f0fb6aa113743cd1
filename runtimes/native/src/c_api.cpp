// c_api.cpp - edge_spec.h over es::Engine. No C++ exception crosses this boundary: every entry point catches
// es::Error (its code becomes the es_status, its text the handle's last error) and anything else (INTERNAL).
#include <atomic>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#pragma GCC visibility push(default)
#include "edge_spec.h"
#pragma GCC visibility pop

#include "engine.h"
#include "errors.h"
#include "text.h"

struct es_runner {
  std::unique_ptr<es::Engine> engine;
  std::unique_ptr<es::TextCodec> text;  // null when the bundle's tokenizer cannot be read (text_error says why)
  std::string text_error;
  std::string last_error;
  std::string info;
  std::atomic<bool> cancel{false};
};

namespace {

thread_local std::string g_open_error;

es_status status_of(es::Code code) { return static_cast<es_status>(static_cast<int>(code)); }

bool valid_utf8(const char* s, size_t* bad_at) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(s);
  for (size_t i = 0; p[i];) {
    const unsigned c = p[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || (n == 2 && c < 0xC2) || (n == 4 && c > 0xF4)) { *bad_at = i; return false; }
    for (size_t k = 1; k < n; ++k)
      if ((p[i + k] & 0xC0) != 0x80) { *bad_at = i; return false; }
    if (n == 3) {
      const unsigned cp = ((c & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
      if (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000)) { *bad_at = i; return false; }
    }
    if (n == 4) {
      const unsigned cp = ((c & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
      if (cp < 0x10000 || cp > 0x10FFFF) { *bad_at = i; return false; }
    }
    i += n;
  }
  return true;
}

void copy_text(char* dst, size_t cap, const std::string& src) {
  const size_t n = std::min(cap - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

void fill_stats(es_stats* out, const es_runner& r, const es::Generation& g) {
  if (!out) return;
  const es::GenerationResult& res = g.result;
  std::memset(out, 0, sizeof *out);
  out->prompt_tokens = res.prompt_tokens;
  out->new_tokens = int32_t(res.tokens.size());
  out->target_passes = res.target_passes;
  out->tau = res.speculative ? res.spec.tau() : 1.0;
  out->prefill_s = res.prefill_s;
  out->decode_s = res.total_s - res.prefill_s;
  out->tok_per_s = out->decode_s > 0 ? out->new_tokens / out->decode_s : 0.0;
  out->spec_used = res.speculative ? 1 : 0;
  const auto& check = r.engine->exactness();
  copy_text(out->host_check, sizeof out->host_check, check ? check->label() : "skipped");
  copy_text(out->notice, sizeof out->notice, g.notice);
}

es::GenerateOptions convert(const es_generate_options& o) {
  es::GenerateOptions g;
  g.max_new_tokens = o.max_new_tokens;
  g.sampling.temperature = o.temperature;
  g.sampling.top_k = o.top_k;
  g.sampling.top_p = o.top_p;
  g.seed = o.seed;
  g.spec = o.spec != 0;
  g.spec_k = o.spec_k;
  g.adaptive = o.adaptive != 0;
  g.lookup = o.lookup != 0;
  return g;
}

// Runs `body`, mapping every exception to a status and the handle's last error.
template <typename F>
es_status guarded(es_runner* r, F&& body) {
  try {
    r->last_error.clear();
    return body();
  } catch (const es::Error& err) {
    r->last_error = err.what();
    return status_of(err.code);
  } catch (const std::bad_alloc&) {
    r->last_error = "out of memory";
    return ES_ERR_INTERNAL;
  } catch (const std::exception& err) {
    r->last_error = err.what();
    return ES_ERR_INTERNAL;
  } catch (...) {
    r->last_error = "unknown error";
    return ES_ERR_INTERNAL;
  }
}

es_status run(es_runner* r, const std::vector<int64_t>& ids, const es_generate_options* options,
              es_token_callback on_token, void* user, es_stats* stats_out) {
  es_generate_options defaults;
  es_default_generate_options(&defaults);
  const es_generate_options& o = options ? *options : defaults;
  if (o.max_new_tokens <= 0) throw es::config_error("max_new_tokens must be > 0, got " + std::to_string(o.max_new_tokens));
  if (o.spec && o.spec_k < 1) throw es::config_error("spec_k must be >= 1, got " + std::to_string(o.spec_k));
  if (o.chat) throw es::config_error("chat applies to text prompts (es_generate), not token ids");
  // the flag is cleared when a run ends, not when it starts: an es_cancel() that lands just before this run began
  // (another thread's tap on "stop") still stops it
  std::unique_ptr<es::TextStream> stream(r->text ? r->text->stream() : nullptr);
  bool stopped = false;
  const auto& stop_ids = r->engine->stop_ids();
  auto sink = [&](int64_t token) {
    if (r->cancel.load()) return !(stopped = true);
    if (on_token) {
      std::string piece = (stream && !stop_ids.count(token)) ? stream->push(int32_t(token)) : std::string();
      if (on_token(user, int32_t(token), piece.c_str()) != 0) return !(stopped = true);
    }
    return true;
  };
  es::Generation g;
  try {
    g = r->engine->generate(ids, convert(o), sink);
  } catch (...) {
    r->cancel = false;
    throw;
  }
  r->cancel = false;
  if (on_token && stream && !stopped) {  // text the stream held back (a run ending inside a UTF-8 sequence)
    std::string tail = stream->finish();
    if (!tail.empty()) on_token(user, -1, tail.c_str());
  }
  fill_stats(stats_out, *r, g);
  if (stopped || g.result.stop_reason == "cancelled") {
    r->last_error = "cancelled: the run stopped after " + std::to_string(g.result.tokens.size()) + " tokens";
    return ES_ERR_CANCELLED;
  }
  return ES_OK;
}

}  // namespace

extern "C" {

es_status es_open_options_defaults(es_open_options* out, size_t struct_size) {
  if (!out) return ES_ERR_ARGUMENT;
  if (struct_size != sizeof(es_open_options)) return ES_ERR_VERSION;  // the one size API version 2 knows
  out->struct_size = struct_size;
  out->threads = 0;
  out->verify_checksums = 1;
  out->host_check = 1;
  out->compute_units = nullptr;
  return ES_OK;
}

void es_default_generate_options(es_generate_options* out) {
  if (!out) return;
  out->max_new_tokens = 128;
  out->chat = 0;
  out->temperature = 0.0f;
  out->top_k = 0;
  out->top_p = 1.0f;
  out->seed = 0;
  out->spec = 1;
  out->spec_k = 4;
  out->adaptive = 1;
  out->lookup = 1;
}

es_status es_open(const char* bundle_dir, const es_open_options* options, es_runner** out) {
  if (!out) {
    g_open_error = "es_open: out is NULL";
    return ES_ERR_ARGUMENT;
  }
  *out = nullptr;
  if (!bundle_dir) {
    g_open_error = "es_open: bundle_dir is NULL";
    return ES_ERR_ARGUMENT;
  }
  if (options && options->struct_size != sizeof(es_open_options)) {
    g_open_error = "es_open: es_open_options.struct_size is " + std::to_string(options->struct_size) +
                   ", this library (API version " + std::to_string(ES_API_VERSION) + ") knows " +
                   std::to_string(sizeof(es_open_options)) + " only\n  fix: start the options with "
                   "es_open_options_init(&options) and build against the edge_spec.h of the library you load";
    return ES_ERR_VERSION;
  }
  es_open_options defaults;
  es_open_options_init(&defaults);
  const es_open_options& o = options ? *options : defaults;
  std::unique_ptr<es_runner> r(new (std::nothrow) es_runner());
  if (!r) {
    g_open_error = "out of memory";
    return ES_ERR_INTERNAL;
  }
  es_status status = guarded(r.get(), [&]() {
    es::OpenOptions open;
    open.threads = o.threads;
    open.verify_checksums = o.verify_checksums != 0;
    open.host_check = o.host_check != 0;
    if (o.compute_units) open.compute_units = o.compute_units;
    r->engine = es::Engine::open(bundle_dir, open);
    try {
      r->text = es::TextCodec::open(bundle_dir, r->engine->manifest());
    } catch (const es::Error& err) {
      r->text_error = err.what();  // es_generate (text) reports it; es_generate_ids works without
    }
    r->info = r->engine->bundle_info_json();
    return ES_OK;
  });
  if (status != ES_OK) {
    g_open_error = r->last_error;
    return status;
  }
  g_open_error.clear();
  *out = r.release();
  return ES_OK;
}

const char* es_open_error(void) { return g_open_error.c_str(); }

es_status es_generate(es_runner* runner, const char* prompt_utf8, const es_generate_options* options,
                      es_token_callback on_token, void* user, es_stats* stats_out) {
  if (!runner) return ES_ERR_ARGUMENT;
  return guarded(runner, [&]() {
    if (!prompt_utf8) throw es::config_error("es_generate: prompt_utf8 is NULL");
    size_t bad = 0;
    if (!valid_utf8(prompt_utf8, &bad))
      throw es::Error(es::Code::Encoding, "the prompt is not valid UTF-8 (byte " + std::to_string(bad) + ")",
                      "pass UTF-8 text");
    if (!runner->text) throw es::bundle_error(runner->text_error, "");
    es_generate_options defaults;
    es_default_generate_options(&defaults);
    const es_generate_options& o = options ? *options : defaults;
    std::vector<int64_t> ids = runner->text->encode_prompt(prompt_utf8, o.chat != 0, "the prompt");
    es_generate_options plain = o;
    plain.chat = 0;  // applied above
    return run(runner, ids, &plain, on_token, user, stats_out);
  });
}

es_status es_generate_ids(es_runner* runner, const int32_t* prompt_ids, size_t n_prompt,
                          const es_generate_options* options, es_token_callback on_token, void* user,
                          es_stats* stats_out) {
  if (!runner) return ES_ERR_ARGUMENT;
  return guarded(runner, [&]() {
    if (!prompt_ids && n_prompt) throw es::config_error("es_generate_ids: prompt_ids is NULL");
    std::vector<int64_t> ids(prompt_ids, prompt_ids + n_prompt);
    return run(runner, ids, options, on_token, user, stats_out);
  });
}

void es_cancel(es_runner* runner) {
  if (runner) runner->cancel = true;
}

const char* es_last_error(const es_runner* runner) { return runner ? runner->last_error.c_str() : ""; }

const char* es_bundle_info_json(const es_runner* runner) { return runner ? runner->info.c_str() : "{}"; }

void es_close(es_runner* runner) { delete runner; }

int32_t es_api_version(void) { return ES_API_VERSION; }

}  // extern "C"
