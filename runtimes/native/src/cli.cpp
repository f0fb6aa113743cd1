// cli.cpp - `edge-spec-run`: the bundle's draft-verify loop from the command line, with the flags and the stats lines
// of `edge-spec generate`. Until the C++ tokenizer is built in, prompts are token ids (--prompt-ids) and the output
// is ids; --json prints one machine-readable line (the tests compare it with the Python runtime's tokens).
// --requests - opens the bundle once and then reads generation requests from stdin, one per line (the generation
// flags below, e.g. `--prompt-ids 1,2,3 --spec-k 2 --fixed-k --max-new-tokens 64`), printing one --json line each
// after a first line with the host check's verdict: what `edge-spec bench --runtime native` drives.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "cli_args.h"
#include "engine.h"
#include "errors.h"
#include "json.h"
#include "text.h"

namespace {

using es_cli::Args;
using es_cli::parse;
using es_cli::SEE_HELP;
using es_cli::stand_in_drafter;

const char* const INTERNAL_FIX =
    "check that the bundle's files are readable; if it persists, report it with the command line";

std::string ids_json(const std::vector<int64_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

// While alive, what the process writes to stdout goes to stderr: the QNN libraries print a line to stdout when they
// load (" # LIBNATIVE: No alternate configuration ...", x86-64 simulator), which would break the --json / --requests
// output; the bundle is opened under this guard.
class StdoutToStderr {
 public:
  StdoutToStderr() {
    std::fflush(stdout);
    saved_ = ::dup(1);
    if (saved_ >= 0) ::dup2(2, 1);
  }
  ~StdoutToStderr() {
    std::fflush(stdout);
    if (saved_ >= 0) {
      ::dup2(saved_, 1);
      ::close(saved_);
    }
  }

 private:
  int saved_ = -1;
};

std::string read_stdin() {
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  return ss.str();
}

template <typename T>
std::string list_json(const std::vector<T>& xs) {
  std::string out = "[";
  for (size_t i = 0; i < xs.size(); ++i) out += (i ? "," : "") + std::to_string(xs[i]);
  return out + "]";
}

// Kernel clocks (target, drafter) read at the first token, i.e. right after the prefill: decode's share of them.
struct KernelMarks {
  double target_at_first = 0, drafter_at_first = 0;
};

double drafter_clock(es::Engine& engine) { return engine.drafter() ? engine.drafter()->kernel_s : 0.0; }

// The --json line of one generation (no closing brace: the caller may add the text).
std::string result_json(es::Engine& engine, const es::Generation& g, const KernelMarks& marks) {
  const es::GenerationResult& r = g.result;
  const es::SpecStats& s = r.spec;
  double k_mean = 0;
  for (int k : s.k_chosen) k_mean += k;
  if (!s.k_chosen.empty()) k_mean /= double(s.k_chosen.size());
  return "{\"tokens\":" + ids_json(r.tokens) + ",\"prompt_tokens\":" + std::to_string(r.prompt_tokens) +
         ",\"stop\":" + es::json_quote(r.stop_reason) + ",\"speculative\":" + (r.speculative ? "true" : "false") +
         ",\"target_passes\":" + std::to_string(r.target_passes) +
         ",\"tau\":" + std::to_string(r.speculative ? s.tau() : 1.0) +
         ",\"lookup_passes\":" + std::to_string(s.lookup_passes) +
         ",\"datastore_passes\":" + std::to_string(s.datastore_passes) + ",\"prefill_s\":" + std::to_string(r.prefill_s) +
         ",\"total_s\":" + std::to_string(r.total_s) + ",\"decode_tok_s\":" + std::to_string(r.decode_tok_s()) +
         ",\"emitted\":" + std::to_string(s.emitted_by_passes) + ",\"drafter_calls\":" + std::to_string(s.drafter_calls) +
         ",\"drafted\":" + list_json(s.drafted) + ",\"accepted\":" + list_json(s.accepted) +
         ",\"k_chosen_mean\":" + (s.k_chosen.empty() ? std::string("null") : std::to_string(k_mean)) +
         // kernel seconds after the first token (the decode's), as edge-spec bench splits the Python runtimes' time
         ",\"target_kernel_s\":" + std::to_string(engine.session().backend.kernel_s - marks.target_at_first) +
         ",\"drafter_kernel_s\":" + std::to_string(drafter_clock(engine) - marks.drafter_at_first) +
         ",\"notice\":" + es::json_quote(g.notice) +
         ",\"host_check\":" + (engine.exactness() ? es::json_quote(engine.exactness()->label()) : "\"skipped\"");
}

// What main prints for an error: `error: WHAT` and its `fix:` line (an Error without a fix gets one from its kind).
int report(const std::string& what, const std::string& fallback_fix) {
  const bool has_fix = what.find("\n  fix: ") != std::string::npos;
  std::fprintf(stderr, "error: %s\n", what.c_str());
  if (!has_fix) std::fprintf(stderr, "  fix: %s\n", fallback_fix.c_str());
  return 2;
}

std::string fix_for(es::Code code) {
  switch (code) {
    case es::Code::Argument: return SEE_HELP;
    case es::Code::Bundle: return "re-run `edge-spec export` into a fresh --out folder";
    case es::Code::Context: return "shorten the prompt, or lower --max-new-tokens";
    default: return INTERNAL_FIX;
  }
}

// --requests -: the host check's verdict first, then one JSON line per stdin line. A line the runner cannot take (junk,
// a bad flag, a request the engine refuses) is answered {"error": ..., "line": N} and the loop goes on; an input with
// no request at all is an error (exit 2).
int serve(es::Engine& engine) {
  const auto& hc = engine.exactness();
  std::printf("{\"runtime\":%s,\"min_rows\":%d,\"host_check\":%s,\"host_check_summary\":%s}\n",
              es::json_quote(engine.runtime_name()).c_str(), engine.session().min_rows,
              hc ? hc->to_json().c_str() : "null", hc ? es::json_quote(hc->summary()).c_str() : "null");
  std::fflush(stdout);
  std::string line;
  int number = 0, requests = 0;
  while (std::getline(std::cin, line)) {
    ++number;
    std::istringstream words(line);
    std::vector<std::string> argv_s = {"edge-spec-run"};
    for (std::string w; words >> w;) argv_s.push_back(w);
    if (argv_s.size() == 1) continue;
    ++requests;
    std::vector<char*> argv;
    for (auto& w : argv_s) argv.push_back(&w[0]);
    std::string error;
    try {
      Args a = parse(int(argv.size()), argv.data(), true);
      KernelMarks marks;
      bool first = true;
      auto on_token = [&](int64_t) {
        if (first) {
          marks.target_at_first = engine.session().backend.kernel_s;
          marks.drafter_at_first = drafter_clock(engine);
          first = false;
        }
        return true;
      };
      std::unique_ptr<es::DrafterBackend> stand_in = stand_in_drafter(a, engine, a.ids.size());
      es::Generation g = engine.generate(a.ids, a.gen, on_token);
      std::printf("%s}\n", result_json(engine, g, marks).c_str());
    } catch (const es::Error& err) {
      error = err.what();
      if (error.find("\n  fix: ") == std::string::npos) error += "\n  fix: " + fix_for(err.code);
    } catch (const std::bad_alloc&) {
      error = "out of memory for this request\n  fix: lower --max-new-tokens, or close other programs";
    } catch (const std::exception& err) {
      error = std::string(err.what()) + "\n  fix: " + INTERNAL_FIX;
    }
    if (!error.empty()) std::printf("{\"error\":%s,\"line\":%d}\n", es::json_quote(error).c_str(), number);
    std::fflush(stdout);
  }
  if (requests == 0)
    throw es::config_error(
        "--requests -: stdin ended without a request (" + std::string(number ? "only blank lines" : "empty input") + ")",
        "send one request per line, e.g. `--prompt-ids 1,2,3 --max-new-tokens 16`, then close stdin");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const es::Error& err) {
    return report(err.what(), fix_for(err.code));
  }
  try {
    std::string notice;
    a.open.threads = es::cap_threads(a.open.threads, &notice);
    if (!notice.empty()) std::fprintf(stderr, "notice: %s\n", notice.c_str());
    std::unique_ptr<es::Engine> engine;
    {
      StdoutToStderr quiet;  // the backend's libraries may print while they load (and the host check runs)
      engine = es::Engine::open(a.bundle, a.open);
    }
    if (a.check) {
      const es::HostCheck& hc = engine->exactness() ? *engine->exactness() : engine->check_host();
      std::printf("%s\n", hc.to_json().c_str());
      std::fprintf(stderr, "[%s]\n", hc.summary().c_str());
      return 0;
    }
    if (a.requests) return serve(*engine);
    std::unique_ptr<es::TextCodec> text;
    std::vector<int64_t> prompt;
    if (a.has_ids) {
      prompt = a.ids;
    } else {
      text = es::TextCodec::open(a.bundle, engine->manifest());
      std::string raw = a.prompt == "-" ? read_stdin() : a.prompt;
      prompt = text->encode_prompt(raw, a.chat, a.prompt == "-" ? "stdin" : "--prompt");
    }
    std::unique_ptr<es::TextStream> stream(text ? text->stream() : nullptr);
    const bool live = !a.json && !a.quiet;
    KernelMarks marks;
    bool first = true;
    auto on_token = [&](int64_t token) {
      if (first) {
        marks.target_at_first = engine->session().backend.kernel_s;
        marks.drafter_at_first = drafter_clock(*engine);
        first = false;
      }
      if (live && !engine->stop_ids().count(token)) {
        std::string piece = stream ? stream->push(int32_t(token)) : std::to_string(token) + " ";
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
      return true;
    };
    std::unique_ptr<es::DrafterBackend> stand_in = stand_in_drafter(a, *engine, prompt.size());
    es::Generation g = engine->generate(prompt, a.gen, on_token);
    const es::GenerationResult& r = g.result;
    std::vector<int64_t> shown;
    for (int64_t t : r.tokens)
      if (!engine->stop_ids().count(t)) shown.push_back(t);
    if (a.json) {
      std::string out = result_json(*engine, g, marks);
      if (text) out += ",\"text\":" + es::json_quote(text->decode(shown));
      std::printf("%s}\n", out.c_str());
    } else {
      if (a.quiet) {
        std::string all = text ? text->decode(shown) : ids_json(shown);
        std::fwrite(all.data(), 1, all.size(), stdout);
      } else if (stream) {
        std::string tail = stream->finish();
        std::fwrite(tail.data(), 1, tail.size(), stdout);
      }
      std::fputs("\n", stdout);
    }
    std::fflush(stdout);
    std::fprintf(stderr, "[%s] %s\n", engine->runtime_name().c_str(), r.summary().c_str());
    if (!g.notice.empty()) std::fprintf(stderr, "notice: %s\n", g.notice.c_str());
    if (r.speculative) {
      std::fprintf(stderr, "[spec k=%d%s] %s\n", a.gen.spec_k, a.gen.adaptive ? " adaptive" : "", r.spec.summary().c_str());
      if (engine->exactness()) std::fprintf(stderr, "[%s]\n", engine->exactness()->summary().c_str());
    }
    return 0;
  } catch (const es::Error& err) {
    return report(err.what(), fix_for(err.code));
  } catch (const std::bad_alloc&) {
    return report("out of memory", "close other programs, or use a smaller bundle (a smaller --max-context at export)");
  } catch (const std::exception& err) {
    return report(err.what(), INTERNAL_FIX);
  }
}
