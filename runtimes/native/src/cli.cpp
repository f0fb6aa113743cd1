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
#include <sstream>
#include <string>
#include <vector>

#include "engine.h"
#include "errors.h"
#include "json.h"
#include "text.h"

namespace {

const char* const USAGE =
    "usage: edge-spec-run --bundle DIR (--prompt TEXT | --prompt - | --prompt-ids 1,2,3) [options]\n"
    "  --chat                  wrap the prompt in the bundle's chat template (needs the tokenizer)\n"
    "  --max-new-tokens N      tokens to generate (default 128)\n"
    "  --temperature T         0 = greedy (default)\n"
    "  --top-k K --top-p P     sampling filters (0 / 1 = off)\n"
    "  --seed S                the portable RNG's seed (default 0)\n"
    "  --spec-k K              draft tokens per target pass (the maximum with --adaptive; default 4)\n"
    "  --adaptive | --fixed-k  pick k per step from measured costs (default) | always draft k\n"
    "  --min-confidence C      adaptive: stop a burst below this drafter confidence (default 0.3)\n"
    "  --no-spec               plain decoding even when the bundle has a drafter\n"
    "  --no-lookup             no prompt-lookup (retrieval) drafting\n"
    "  --ignore-eos            generate max-new-tokens even past an end-of-sequence token\n"
    "  --threads N             intra-op threads: XNNPACK's (executorch), onnxruntime's (onnx, qnn); default: the runtime's\n"
    "  --compute-units U       coreml bundles: all (default) | cpu_and_ne | cpu_and_gpu | cpu (Core ML's devices)\n"
    "  --provider qnn|cpu      qnn bundles: the HTP through onnxruntime's QNN EP (default; simulated on x86-64) | the\n"
    "                          QDQ graphs on onnxruntime's CPU provider (also $EDGE_SPEC_QNN_PROVIDER)\n"
    "  --qnn-ep PATH           the QNN EP plugin (libonnxruntime_providers_qnn.so; default: $EDGE_SPEC_QNN_EP, else the\n"
    "                          onnxruntime-qnn wheel's found at build time)\n"
    "  --no-host-check         skip the exactness probe at open\n"
    "  --no-checksums          skip the sha256 of the bundle's files\n"
    "  --check                 print the host check's verdict (JSON) and exit\n"
    "  --fresh-check           probe again even when a cached verdict exists\n"
    "  --json                  print one JSON line (tokens, stats) instead of the text\n"
    "  --quiet                 print only the final text / ids, no streaming\n"
  "  --requests -            open once, then one generation per stdin line (its flags; --prompt-ids), one --json\n"
  "                          line each, after a first line {runtime, host_check, min_rows} (a driver's protocol)\n"
    "tests only:\n"
    "  --test-oracle-drafts IDS --test-wrong never|always|third|random\n"
    "                          replace the drafter by one proposing IDS (the known continuation), wrong where told\n";

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "error: %s\n%s", what.c_str(), USAGE);
  std::exit(2);
}

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end) usage_error("--prompt-ids takes comma-separated integers, got '" + item + "'");
    ids.push_back(v);
  }
  return ids;
}

std::string ids_json(const std::vector<int64_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

struct Args {
  std::string bundle, prompt, prompt_ids, oracle_ids, wrong = "never";
  bool has_prompt = false, has_ids = false, chat = false, json = false, quiet = false, check = false;
  bool requests = false;  // --requests -: generation requests on stdin
  es::OpenOptions open;
  es::GenerateOptions gen;
};

// `request`: one line of --requests (generation flags only; no --bundle)
Args parse(int argc, char** argv, bool request = false) {
  Args a;
  a.gen.adaptive = true;  // as `edge-spec generate`
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(f + " needs a value");
      return argv[++i];
    };
    auto number = [&]() -> double {
      std::string v = value();
      char* end = nullptr;
      double d = std::strtod(v.c_str(), &end);
      if (v.empty() || *end) usage_error(f + " takes a number, got '" + v + "'");
      return d;
    };
    if (f == "--help" || f == "-h") { std::fputs(USAGE, stdout); std::exit(0); }
    else if (f == "--bundle") a.bundle = value();
    else if (f == "--prompt") { a.prompt = value(); a.has_prompt = true; }
    else if (f == "--prompt-ids") { a.prompt_ids = value(); a.has_ids = true; }
    else if (f == "--chat") a.chat = true;
    else if (f == "--max-new-tokens") a.gen.max_new_tokens = int(number());
    else if (f == "--temperature") a.gen.sampling.temperature = number();
    else if (f == "--top-k") a.gen.sampling.top_k = int(number());
    else if (f == "--top-p") a.gen.sampling.top_p = number();
    else if (f == "--seed") a.gen.seed = uint64_t(std::strtoull(value().c_str(), nullptr, 10));
    else if (f == "--spec-k") a.gen.spec_k = int(number());
    else if (f == "--adaptive") a.gen.adaptive = true;
    else if (f == "--fixed-k") a.gen.adaptive = false;
    else if (f == "--min-confidence") a.gen.min_confidence = number();
    else if (f == "--no-spec") a.gen.spec = false;
    else if (f == "--no-lookup") a.gen.lookup = false;
    else if (f == "--ignore-eos") a.gen.ignore_eos = true;
    else if (f == "--threads") a.open.threads = int(number());
    else if (f == "--compute-units") a.open.compute_units = value();
    else if (f == "--provider" && !request) a.open.provider = value();
    else if (f == "--qnn-ep" && !request) a.open.qnn_ep = value();
    else if (f == "--no-host-check") a.open.host_check = false;
    else if (f == "--no-checksums") a.open.verify_checksums = false;
    else if (f == "--check") a.check = true;
    else if (f == "--fresh-check") a.open.fresh_check = true;
    else if (f == "--json") a.json = true;
    else if (f == "--quiet") a.quiet = true;
    else if (f == "--requests" && !request) {
      if (value() != "-") usage_error("--requests takes '-' (the requests come on stdin)");
      a.requests = true;
    }
    else if (f == "--test-oracle-drafts") a.oracle_ids = value();
    else if (f == "--test-wrong") a.wrong = value();
    else usage_error("unknown option " + f);
  }
  if (request) {
    if (!a.has_ids || a.has_prompt) usage_error("a --requests line needs --prompt-ids (and no --prompt)");
  } else if (a.bundle.empty()) {
    usage_error("--bundle is required");
  } else if (!a.check && !a.requests && a.has_prompt == a.has_ids) {
    usage_error("pass exactly one of --prompt and --prompt-ids");
  }
  if (!a.oracle_ids.empty()) a.gen.oracle = es::OracleDrafts{parse_ids(a.oracle_ids), a.wrong};
  return a;
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
         ",\"lookup_passes\":" + std::to_string(s.lookup_passes) + ",\"prefill_s\":" + std::to_string(r.prefill_s) +
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

// --requests -: the host check's verdict first, then one JSON line per stdin line (a request's own error is a
// {"error": ...} line; the loop goes on).
int serve(es::Engine& engine) {
  const auto& hc = engine.exactness();
  std::printf("{\"runtime\":%s,\"min_rows\":%d,\"host_check\":%s,\"host_check_summary\":%s}\n",
              es::json_quote(engine.runtime_name()).c_str(), engine.session().min_rows,
              hc ? hc->to_json().c_str() : "null", hc ? es::json_quote(hc->summary()).c_str() : "null");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream words(line);
    std::vector<std::string> argv_s = {"edge-spec-run"};
    for (std::string w; words >> w;) argv_s.push_back(w);
    if (argv_s.size() == 1) continue;
    std::vector<char*> argv;
    for (auto& w : argv_s) argv.push_back(&w[0]);
    Args a = parse(int(argv.size()), argv.data(), true);
    try {
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
      es::Generation g = engine.generate(parse_ids(a.prompt_ids), a.gen, on_token);
      std::printf("%s}\n", result_json(engine, g, marks).c_str());
    } catch (const es::Error& err) {
      std::printf("{\"error\":%s}\n", es::json_quote(err.what()).c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
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
      if (a.chat) usage_error("--chat applies to --prompt text, not --prompt-ids");
      prompt = parse_ids(a.prompt_ids);
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
    std::fprintf(stderr, "error: %s\n", err.what());
    return 2;
  } catch (const std::exception& err) {
    std::fprintf(stderr, "error: %s\n", err.what());
    return 1;
  }
}
