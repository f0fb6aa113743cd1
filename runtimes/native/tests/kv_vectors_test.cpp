// kv_vectors_test.cpp - replays the shared KV vectors (tests/vectors/kv_cases.json, written by make_kv_vectors.py
// from edge_spec/contract/kv.py) against kv.cpp: every operation's masks, the state after it, and every refusal's text.
//
//   kv_vectors_test [VECTORS_JSON]      exit 0 and "kv vectors: N cases, M operations, all equal" when all pass
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "errors.h"
#include "json.h"
#include "kv.h"
#include "manifest.h"

namespace {

int failures = 0;

void fail(const std::string& where, const std::string& what) {
  if (++failures <= 20) std::fprintf(stderr, "FAIL %s: %s\n", where.c_str(), what.c_str());
}

std::string rows_text(const es::Mask& m) {
  std::string out;
  for (int r = 0; r < m.rows; ++r) {
    for (int c = 0; c < m.cols; ++c) out += m.at(r, c) == 0.0f ? '0' : '-';
    out += '|';
  }
  return out;
}

std::string rows_text(const es::Json& rows) {
  std::string out;
  for (const auto& r : rows.as_array()) out += r.as_string() + "|";
  return out;
}

void check_state(const std::string& where, const es::KVState& s, const es::Json& want) {
  if (s.length != want.at("length").as_int())
    fail(where, "length " + std::to_string(s.length) + " != " + want.at("length").dump());
  for (const auto& kind : want.at("slot_pos").as_object()) {
    std::string got = "[";
    for (size_t i = 0; i < s.slot_pos.at(kind.first).size(); ++i)
      got += (i ? "," : "") + std::to_string(s.slot_pos.at(kind.first)[i]);
    if (got + "]" != kind.second.dump()) fail(where, kind.first + " slot_pos " + got + "] != " + kind.second.dump());
  }
  for (const auto& kind : want.at("retained_from").as_object())
    if (s.retained_from.at(kind.first) != kind.second.as_int())
      fail(where, kind.first + " retained_from " + std::to_string(s.retained_from.at(kind.first)) + " != " +
                      kind.second.dump());
}

int pure_checks(const es::Json& pure) {
  int n = 0;
  for (const auto& c : pure.at("bucket_slots").as_array()) {
    const auto& v = c.as_array();
    ++n;
    if (es::bucket_slots(int(v[0].as_int()), int(v[1].as_int()), int(v[2].as_int())) != v[3].as_int())
      fail("bucket_slots", c.dump());
  }
  for (const auto& c : pure.at("ring_slots").as_array()) {
    const auto& v = c.as_array();
    ++n;
    if (es::ring_slots(int(v[0].as_int()), int(v[1].as_int()), int(v[2].as_int()), v[3].as_string()) != v[4].as_int())
      fail("ring_slots", c.dump());
  }
  for (const auto& c : pure.at("commit_slots").as_array()) {
    const auto& v = c.as_array();
    ++n;
    auto got = es::commit_slots(v[0].as_int(), int(v[1].as_int()), int(v[2].as_int()), v[3].as_bool());
    std::string rows = "[", slots = "[";
    for (size_t i = 0; i < got.first.size(); ++i) {
      rows += (i ? "," : "") + std::to_string(got.first[i]);
      slots += (i ? "," : "") + std::to_string(got.second[i]);
    }
    if (rows + "]" != v[4].dump() || slots + "]" != v[5].dump()) fail("commit_slots", c.dump());
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "runtimes/native/tests/vectors/kv_cases.json";
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "error: %s cannot be read\n  fix: run from the repository root, or pass the file\n", path.c_str());
    return 2;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const es::Json doc = es::Json::parse(ss.str());
  if (doc.at("version").as_int() != 1) {
    std::fprintf(stderr, "error: %s has vector version %s, this test reads 1\n", path.c_str(), doc.at("version").dump().c_str());
    return 2;
  }
  int cases = 0, ops = 0;
  for (const auto& c : doc.at("cases").as_array()) {
    ++cases;
    const std::string name = c.at("name").as_string() + "/seed " + c.at("seed").dump();
    es::KVState state(es::layout_from_json(c.at("layout")));
    int i = 0;
    for (const auto& op : c.at("ops").as_array()) {
      ++ops;
      const std::string where = name + " op " + std::to_string(i++) + " " + op.dump().substr(0, 60);
      const std::string kind = op.at("op").as_string();
      es::Masks masks;
      std::string error;
      try {
        if (kind == "masks") masks = state.masks(int(op.at("n").as_int()));
        else if (kind == "drafter_masks") masks = state.drafter_masks();
        else if (kind == "written") state.written(int(op.at("n").as_int()));
        else if (kind == "commit") {
          const int n = int(op.at("n").as_int());
          state.advance(n, state.plan_commit(n));
        } else if (kind == "rewind") state.rewind(op.at("pos").as_int());
        else if (kind == "reset") state.reset();
        else fail(where, "unknown op");
      } catch (const es::Error& err) {
        error = err.what();
      }
      const std::string want_error = op.has("error") ? op.at("error").as_string() : "";
      if (error != want_error) fail(where, "error '" + error + "' != '" + want_error + "'");
      if (op.has("masks"))
        for (const auto& m : op.at("masks").as_object()) {
          if (!masks.count(m.first)) fail(where, "no " + m.first + " mask");
          else if (rows_text(masks.at(m.first)) != rows_text(m.second))
            fail(where, m.first + " mask " + rows_text(masks.at(m.first)) + " != " + rows_text(m.second));
        }
      check_state(where, state, op.at("state"));
    }
  }
  const int pure = pure_checks(doc.at("pure"));
  if (failures) {
    std::fprintf(stderr, "kv vectors: %d failures\n", failures);
    return 1;
  }
  std::printf("kv vectors: %d cases, %d operations, %d pure-function cases, all equal\n", cases, ops, pure);
  return 0;
}
