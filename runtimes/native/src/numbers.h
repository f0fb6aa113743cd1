// numbers.h - strict text -> number for the CLI's flags and its --requests lines: the whole text is the number (no
// trailing characters, no fraction where an integer is meant, no wrap-around), integers inside the flag's range;
// anything else is an Error(Code::Argument) "--FLAG expects an integer in [lo, hi], got 'TEXT'" with the fix (the CLI
// prints it as `error: ...` / `fix: ...` and exits 2). Header-only: the CLI is its one user.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <system_error>

#include "errors.h"

namespace es {

constexpr int64_t INT32_TOP = 2147483647;

inline std::string shown_text(const std::string& text) {  // the value as given, cut short if long
  return "'" + (text.size() > 40 ? text.substr(0, 37) + "..." : text) + "'";
}

// An integer in [lo, hi] (decimal, an optional leading '-').
inline int64_t parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi,
                         const std::string& fix) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto r = std::from_chars(text.data(), end, v);
  if (text.empty() || r.ec != std::errc() || r.ptr != end || v < lo || v > hi)
    throw config_error(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "], got " + shown_text(text),
                       fix);
  return v;
}

// An unsigned 64-bit integer (a seed): 0 .. 18446744073709551615.
inline uint64_t parse_u64(const std::string& flag, const std::string& text, const std::string& fix) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto r = std::from_chars(text.data(), end, v);
  if (text.empty() || r.ec != std::errc() || r.ptr != end)
    throw config_error(flag + " expects an integer in [0, " + std::to_string(std::numeric_limits<uint64_t>::max()) +
                           "], got " + shown_text(text),
                       fix);
  return v;
}

// A finite decimal number ("0.7", "-1", "1e-3"; not "nan", "inf", hex or trailing text). Its range is the engine's
// check (check_sampling, check_spec_args: the same wording for the CLI and the C API), which the CLI runs right after
// parsing, before the bundle is opened.
inline double parse_number(const std::string& flag, const std::string& text, const std::string& fix) {
  char* end = nullptr;
  const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  // strtod takes leading spaces, hex and "inf"/"nan": refuse all three (a flag's number is plain decimal)
  const bool plain = !text.empty() && text.find_first_not_of("0123456789+-.eE") == std::string::npos;
  if (!plain || end != text.c_str() + text.size() || !std::isfinite(v))
    throw config_error(flag + " expects a decimal number, got " + shown_text(text), fix);
  return v;
}

}  // namespace es
