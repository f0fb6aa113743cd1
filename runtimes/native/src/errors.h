// errors.h - every error the runner raises on purpose: a code (the C API's es_status), what is wrong, the fix.
//
// Same wording rule as edge_spec/errors.py: str = "<what>\n  fix: <fix>". The C API catches Error and hands
// out the code and the text; nothing else may escape the C boundary (c_api.cpp maps the rest to INTERNAL).
#pragma once

#include <stdexcept>
#include <string>

namespace es {

enum class Code { Argument = 1, Bundle = 2, Backend = 3, Context = 4, Encoding = 5, Cancelled = 6, Internal = 7 };

class Error : public std::runtime_error {
 public:
  Error(Code code, const std::string& what, const std::string& fix = "")
      : std::runtime_error(fix.empty() ? what : what + "\n  fix: " + fix), code(code) {}
  Code code;
};

inline Error config_error(const std::string& what, const std::string& fix = "") {
  return Error(Code::Argument, what, fix);
}
inline Error bundle_error(const std::string& what, const std::string& fix = "") {
  return Error(Code::Bundle, what, fix);
}
inline Error backend_error(const std::string& what, const std::string& fix = "") {
  return Error(Code::Backend, what, fix);
}
inline Error context_error(const std::string& what, const std::string& fix = "") {
  return Error(Code::Context, what, fix);
}
// A KV-state operation that would give wrong logits (edge_spec.errors.KVStateError): an internal-state refusal.
inline Error kv_state_error(const std::string& what, const std::string& fix = "") {
  return Error(Code::Internal, what, fix);
}

}  // namespace es
