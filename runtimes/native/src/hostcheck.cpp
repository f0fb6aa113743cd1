// hostcheck.cpp - see hostcheck.h; probe_windows and the row modes follow edge_spec/decoding/hostcheck.py.
#include "hostcheck.h"

#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "json.h"
#include "sampling.h"
#include "sha256.h"

namespace es {

namespace {

const char* const KERNEL_FLAGS[] = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                    "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "asimd",
                                    "asimddp", "i8mm", "sve", "sme"};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Max |verify row - decode step| over `windows` (0 when bit-identical) and the median decode step in ms.
std::pair<double, double> run_mode(Session& session, const std::vector<int64_t>& tokens,
                                   const std::vector<std::pair<int, int>>& windows, int min_rows) {
  session.reset();
  session.min_rows = min_rows;
  const int vocab = session.backend.vocab_size();
  double worst = 0.0;
  std::vector<double> times;
  for (size_t w = 0; w < windows.size(); ++w) {
    const int start = windows[w].first;
    if (session.length() < start)
      session.prefill(std::vector<int64_t>(tokens.begin() + session.length(), tokens.begin() + start));
    int t = windows[w].second;  // cut to the longest verify pass decoding takes here (kv.h pass_cap)
    if (const int cap = pass_cap(session.state.layout(), session.length(), min_rows)) t = std::min(t, cap);
    std::vector<int64_t> span(tokens.begin() + start, tokens.begin() + start + t);
    StepOutput verify = session.forward(span);  // one pass, not committed: [T, V]
    for (int i = 0; i < t; ++i) {  // plain decoding: one token per pass, committed
      const double begin = now_s();
      StepOutput step = session.forward({span[i]});
      if (w) times.push_back(now_s() - begin);  // the first window pays first-run costs
      session.commit(1);
      for (int j = 0; j < vocab; ++j) {
        const float a = step.logits[j], b = verify.logits[size_t(i) * vocab + j];
        if (a != b && !(std::isnan(a) && std::isnan(b))) {
          const double d = std::fabs(double(a) - double(b));
          worst = std::max({worst, std::isfinite(d) ? d : INFINITY, 1e-45});
        }
      }
    }
  }
  session.reset();
  double median = NAN;
  if (!times.empty()) {
    std::sort(times.begin(), times.end());
    const size_t n = times.size();
    median = (n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2])) * 1e3;
  }
  return {worst, median};
}

}  // namespace

int HostCheck::min_rows() const {
  if (one_row_max_diff == 0.0) return 1;
  if (two_row_max_diff == 0.0) return 2;
  return 0;
}

std::string HostCheck::label() const {
  return min_rows() == 1 ? "exact-one-row" : min_rows() == 2 ? "exact-two-row" : "inexact";
}

std::string HostCheck::summary() const {
  char buf[400];
  if (min_rows() == 1) return "exactness: host-checked, verify rows == decode steps bit for bit";
  if (min_rows() == 2) {
    std::snprintf(buf, sizeof buf, "exactness: host-checked, exact with two-row passes (this CPU's one-row kernels sum "
                  "in another order; a decode step costs %.1f ms instead of %.1f)", two_row_step_ms, one_row_step_ms);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "exactness: NOT batch-invariant on this host (verify rows differ from decode steps by "
                "up to %.2g): speculative decoding is off, plain decoding runs instead",
                std::min(one_row_max_diff, two_row_max_diff));
  return buf;
}

std::string HostCheck::to_json() const {
  std::ostringstream o;
  o << "{\"runtime\":" << json_quote(runtime) << ",\"cpu\":" << json_quote(cpu) << ",\"windows\":[";
  for (size_t i = 0; i < windows.size(); ++i) o << (i ? "," : "") << "[" << windows[i].first << "," << windows[i].second << "]";
  auto num = [](double v) {
    if (std::isnan(v)) return std::string("null");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", std::isinf(v) ? 1e300 : v);  // exact round trip (0 stays 0)
    return std::string(buf);
  };
  o << "],\"one_row_max_diff\":" << num(one_row_max_diff) << ",\"two_row_max_diff\":" << num(two_row_max_diff)
    << ",\"one_row_step_ms\":" << num(one_row_step_ms) << ",\"two_row_step_ms\":" << num(two_row_step_ms)
    << ",\"min_rows\":" << min_rows() << ",\"verdict\":\"" << label() << "\"}";
  return o.str();
}

HostCheck HostCheck::from_json(const std::string& text) {
  const Json j = Json::parse(text);
  HostCheck c;
  c.runtime = j.at("runtime").as_string();
  c.cpu = j.at("cpu").as_string();
  for (const auto& w : j.at("windows").as_array())
    c.windows.push_back({int(w.as_array().at(0).as_int()), int(w.as_array().at(1).as_int())});
  auto num = [&](const char* key) { return j.at(key).is_null() ? NAN : j.at(key).as_number(); };
  c.one_row_max_diff = num("one_row_max_diff");
  c.two_row_max_diff = num("two_row_max_diff");
  c.one_row_step_ms = num("one_row_step_ms");
  c.two_row_step_ms = num("two_row_step_ms");
  return c;
}

std::string cpu_identity() {
  std::map<std::string, std::string> info;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = trim(line.substr(0, colon));
    std::transform(key.begin(), key.end(), key.begin(), ::tolower);
    info.emplace(key, trim(line.substr(colon + 1)));  // the first CPU's entry
  }
  struct utsname u;
  const std::string machine = ::uname(&u) == 0 ? u.machine : "unknown";
  std::string model = info.count("model name") ? info["model name"] : info.count("hardware") ? info["hardware"] : "unknown CPU";
  std::set<std::string> flags;
  std::istringstream words(info.count("flags") ? info["flags"] : info.count("features") ? info["features"] : "");
  for (std::string w; words >> w;) flags.insert(w);
  std::string present;
  for (const char* flag : KERNEL_FLAGS)
    if (flags.count(flag)) present += (present.empty() ? "" : " ") + std::string(flag);
  return model + " [" + machine + (present.empty() ? "" : ": " + present) + "]";
}

std::vector<std::pair<int, int>> probe_windows(const KVLayout& layout, int max_t, int edge) {
  max_t = std::max(2, max_t);
  std::vector<int> edges;
  if (edge) edges = {edge, 2 * edge};
  for (const auto& c : layout.caches)
    if (c.kind == SLIDING) {
      edges.push_back(c.slots);
      edges.push_back(2 * c.slots);
    }
  std::vector<std::pair<int, int>> kept;
  auto keep = [&](int start, int t) {
    const bool fits = start >= 1 && start + t + 1 <= layout.max_context;  // + 1: room for two-row mode's dummy row
    for (const auto& w : kept)
      if (start < w.first + w.second && w.first < start + t) return;
    if (fits) kept.push_back({start, t});
  };
  std::set<int> unique(edges.begin(), edges.end());
  const int pattern[4] = {max_t, 3, max_t, 2};  // [max_t, 3, max_t, 2] * len(edges), zipped with the sorted edges
  int i = 0;
  for (int e : unique) {
    const int t = std::min(pattern[i++ % 4], max_t);
    keep(e - t / 2, t);
  }
  if (pass_cap(layout, 0, 1)) keep(SCORE_EDGE / 2 - max_t / 2, max_t);  // long heads in a fused kernel (hostcheck.py)
  const std::pair<int, int> small[4] = {{2, 2}, {5, 3}, {9, std::min(5, max_t)}, {15, max_t}};
  for (const auto& w : small) keep(w.first, w.second);
  std::sort(kept.begin(), kept.end());
  return kept;
}

HostCheck probe(Session& session, int vocab_size, int max_t, uint64_t seed) {
  const KVLayout& layout = session.state.layout();
  if (layout.max_pass > 0) max_t = std::min(max_t, layout.max_pass);
  HostCheck check;
  check.runtime = session.backend.identity();
  check.cpu = cpu_identity();
  check.windows = probe_windows(layout, max_t, session.backend.bucket_size());
  PortableRng rng(seed);
  std::vector<int64_t> tokens(size_t(check.windows.back().first + check.windows.back().second));
  for (auto& t : tokens) t = int64_t(rng.next_u64() % uint64_t(vocab_size));
  if (session.backend.first_token() >= 0) tokens[0] = session.backend.first_token();  // probe as a prompt starts
  const int keep = session.min_rows;
  auto one = run_mode(session, tokens, check.windows, 1);
  auto two = run_mode(session, tokens, check.windows, 2);
  session.min_rows = keep;
  check.one_row_max_diff = one.first;
  check.one_row_step_ms = one.second;
  check.two_row_max_diff = two.first;
  check.two_row_step_ms = two.second;
  return check;
}


namespace {

constexpr int PROBE_VERSION = 1;

std::string cache_dir() {
  const char* env = std::getenv("EDGE_SPEC_CACHE");
  if (env && *env) return std::string(env) + "/hostcheck-native";
  const char* home = std::getenv("HOME");
  return home && *home ? std::string(home) + "/.cache/edge-spec/hostcheck-native" : "";
}

bool make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') {
      const std::string part = path.substr(0, i);
      if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
  return true;
}

}  // namespace

HostCheck checked(Session& session, int vocab_size, const std::string& artifact, int max_t, bool fresh,
                  bool* from_cache) {
  if (from_cache) *from_cache = false;
  const std::string dir = cache_dir();
  const std::string key = sha256_hex(json_quote(artifact) + "|" + json_quote(session.backend.identity()) + "|" +
                                     json_quote(cpu_identity()) + "|" + std::to_string(PROBE_VERSION)).substr(0, 32);
  const std::string path = dir.empty() ? "" : dir + "/" + key + ".json";
  if (!path.empty() && !fresh) {
    std::ifstream f(path);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      try {
        HostCheck c = HostCheck::from_json(ss.str());
        if (from_cache) *from_cache = true;
        return c;
      } catch (const std::exception&) {  // a damaged or older entry: probe again
      }
    }
  }
  HostCheck c = probe(session, vocab_size, max_t);
  if (!path.empty() && make_dirs(dir)) {
    const std::string tmp = path + "." + std::to_string(::getpid());
    std::ofstream out(tmp);
    out << c.to_json();
    out.close();
    if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());  // atomic, or nothing
  }
  return c;
}

}  // namespace es
