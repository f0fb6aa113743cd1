// cli_args.h - edge-spec-run's command line (and each --requests line): the flags, their strict parsing (numbers.h:
// a whole number in the flag's range, or an error naming the flag, the range, the text and the fix) and the checks that
// need no bundle. Header-only: cli.cpp is its one user (the phone builds compile src/*.cpp but cli.cpp).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"
#include "errors.h"
#include "numbers.h"
#include "sampling.h"
#include "speculative.h"
#ifdef ES_TEST_HOOKS
#include "test_hooks.h"
#endif

namespace es_cli {

inline const char* const USAGE =
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
    "  --no-datastore          no drafting from the bundle's static datastore (datastore.bin, where it has one)\n"
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
#ifdef ES_TEST_HOOKS
    "tests only (edge-spec-run-test, the test build; edge-spec-run has no such flags):\n"
    "  --test-oracle-drafts IDS --test-wrong never|always|third|random\n"
    "                          replace the drafter by one proposing IDS (the known continuation), wrong where told\n"
    "  --test-accept-all       a wrong verifier that keeps every draft (the drafter's accepted rows exercised)\n"
#endif
    ;

inline const char* const SEE_HELP = "see edge-spec-run --help for the flags";

// A bad command line (or --requests line): an Error the caller prints as `error:` / `fix:` (exit 2), or, for a
// --requests line, answers with a {"error": ..., "line": N} line before reading the next.
[[noreturn]] inline void usage_error(const std::string& what, const std::string& fix = SEE_HELP) {
  throw es::config_error(what, fix);
}

inline std::vector<int64_t> parse_ids(const std::string& flag, const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty())  // the vocabulary's range is the engine's check (it names the bundle's vocabulary size)
      ids.push_back(es::parse_int(flag, item, 0, es::INT32_TOP, "pass comma-separated token ids: " + flag + " 1,2,3"));
  return ids;
}

// threads: [1, ...] here; more than this machine's cores is capped by the engine (es::cap_threads) with a notice.
inline std::string threads_fix() {
  const unsigned cores = std::thread::hardware_concurrency();
  return "pass --threads 1 up to this machine's " + (cores ? std::to_string(cores) + " " : std::string()) +
         "cores, or leave it out for the runtime's default";
}

struct Args {
  std::string bundle, prompt, prompt_ids;
  std::vector<int64_t> ids;  // --prompt-ids, parsed
  bool has_prompt = false, has_ids = false, chat = false, json = false, quiet = false, check = false;
  bool requests = false;  // --requests -: generation requests on stdin
  es::OpenOptions open;
  es::GenerateOptions gen;
#ifdef ES_TEST_HOOKS
  std::string oracle_ids, wrong = "never";
  es::OracleDrafts oracle;  // --test-oracle-drafts (empty: the bundle's drafter)
#endif
};

// `request`: one line of --requests (generation flags only; no --bundle)
inline Args parse(int argc, char** argv, bool request = false) {
  Args a;
  a.gen.adaptive = true;  // as `edge-spec generate`
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(f + " needs a value", "pass " + f + " VALUE (edge-spec-run --help)");
      return argv[++i];
    };
    auto integer = [&](int64_t lo, const std::string& fix) {
      return int(es::parse_int(f, value(), lo, es::INT32_TOP, fix));
    };
    auto number = [&](const std::string& fix) { return es::parse_number(f, value(), fix); };
    if ((f == "--help" || f == "-h") && !request) { std::fputs(USAGE, stdout); std::exit(0); }
    else if (f == "--bundle") a.bundle = value();
    else if (f == "--prompt") { a.prompt = value(); a.has_prompt = true; }
    else if (f == "--prompt-ids") { a.prompt_ids = value(); a.has_ids = true; }
    else if (f == "--chat") a.chat = true;
    else if (f == "--max-new-tokens")
      a.gen.max_new_tokens = integer(1, "pass --max-new-tokens 1 or more (the number of tokens to generate)");
    else if (f == "--temperature")
      a.gen.sampling.temperature = number("use --temperature 0 for greedy decoding, or a value such as 0.7");
    else if (f == "--top-k") a.gen.sampling.top_k = integer(0, "use --top-k 0 to disable top-k, or a value such as 40");
    else if (f == "--top-p")
      a.gen.sampling.top_p = number("use --top-p 1 to disable nucleus sampling, or a value such as 0.95");
    else if (f == "--seed") a.gen.seed = es::parse_u64(f, value(), "pass --seed 0 or a larger integer");
    else if (f == "--spec-k")
      a.gen.spec_k = integer(1, "use --spec-k 4, for example (at most the bundle's max draft length)");
    else if (f == "--adaptive") a.gen.adaptive = true;
    else if (f == "--fixed-k") a.gen.adaptive = false;
    else if (f == "--min-confidence") a.gen.min_confidence = number("use --min-confidence 0.3");
    else if (f == "--no-spec") a.gen.spec = false;
    else if (f == "--no-lookup") a.gen.lookup = false;
    else if (f == "--no-datastore") a.gen.datastore = false;
    else if (f == "--ignore-eos") a.gen.ignore_eos = true;
    else if (f == "--threads") a.open.threads = integer(1, threads_fix());
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
      if (value() != "-") usage_error("--requests takes '-' (the requests come on stdin)", "pass --requests -");
      a.requests = true;
    }
#ifdef ES_TEST_HOOKS
    else if (f == "--test-oracle-drafts") a.oracle_ids = value();
    else if (f == "--test-wrong") a.wrong = value();
    else if (f == "--test-accept-all") a.gen.accept_all = true;
#endif
    else if (request)
      usage_error("unknown option " + es::shown_text(f), "a --requests line takes generation flags: --prompt-ids "
                  "1,2,3 --max-new-tokens N --spec-k K ... (edge-spec-run --help)");
    else usage_error("unknown option " + es::shown_text(f));
  }
  if (request) {
    if (!a.has_ids || a.has_prompt)
      usage_error("a --requests line needs --prompt-ids (and no --prompt)", "start the line with --prompt-ids 1,2,3");
  } else if (a.bundle.empty()) {
    usage_error("--bundle is required", "pass --bundle DIR (the --out folder of `edge-spec export`)");
  } else if (!a.check && !a.requests && a.has_prompt == a.has_ids) {
    usage_error("pass exactly one of --prompt and --prompt-ids",
                "pass --prompt TEXT (or - for stdin), or --prompt-ids 1,2,3");
  }
  if (a.has_ids && a.chat)
    usage_error("--chat applies to --prompt text, not --prompt-ids", "drop --chat, or pass --prompt TEXT");
  if (a.has_ids) a.ids = parse_ids("--prompt-ids", a.prompt_ids);  // before any work
  es::check_sampling(a.gen.sampling);  // the numbers' ranges, in the engine's words, before the bundle is opened
  es::check_spec_args(a.gen.spec_k, a.gen.min_confidence);
#ifdef ES_TEST_HOOKS
  if (!a.oracle_ids.empty()) a.oracle = es::OracleDrafts{parse_ids("--test-oracle-drafts", a.oracle_ids), a.wrong};
#endif
  return a;
}

// The drafter standing in for the bundle's for one generation (a.gen.drafter points at it while it lives): the test
// build's oracle drafter when --test-oracle-drafts was given, else none (always none in edge-spec-run).
inline std::unique_ptr<es::DrafterBackend> stand_in_drafter(Args& a, const es::Engine& engine, size_t prompt_len) {
  std::unique_ptr<es::DrafterBackend> drafter;
#ifdef ES_TEST_HOOKS
  if (!a.oracle.continuation.empty())
    drafter = es::make_oracle_drafter(a.oracle, int(prompt_len), engine.manifest().vocab_size);
#else
  (void)engine;
  (void)prompt_len;
#endif
  a.gen.drafter = drafter.get();
  return drafter;
}

}  // namespace es_cli
