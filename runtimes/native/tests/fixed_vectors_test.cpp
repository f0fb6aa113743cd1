// fixed_vectors_test.cpp - replays the shared fixed-shape vectors (tests/vectors/fixed_cases.json, written by
// make_fixed_vectors.py from runtimes/fixed.py) against fixed.cpp and tensor.cpp: every padded pass's length, ids,
// positions, masks and `state` write slots, the `io` caches after every commit (new rows read back through
// copy_box from a padded, strided output like an MLMultiArray's), the drafter's masks, the refusals' texts, and the
// float16 conversions; plus tensor.cpp's own edge cases (every half value round-trips, strided / typed reads).
//
//   fixed_vectors_test [VECTORS_JSON]      exit 0 and "fixed vectors: ... all equal" when all pass
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "errors.h"
#include "fixed.h"
#include "json.h"
#include "kv.h"
#include "manifest.h"
#include "tensor.h"

namespace {

using es::Json;

const char* const FIX = "re-export with --max-pass";
int failures = 0, checks = 0;

void expect(bool ok, const std::string& where, const std::string& what) {
  ++checks;
  if (!ok && ++failures <= 25) std::fprintf(stderr, "FAIL %s: %s\n", where.c_str(), what.c_str());
}

std::string rows_text(const float* m, int rows, int cols) {
  std::string out;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const float v = m[size_t(r) * cols + c];
      out += v == 0.0f ? '0' : v == es::NEG_INF ? '-' : '?';
    }
    out += '|';
  }
  return out;
}

std::string rows_text(const Json& rows) {
  std::string out;
  for (const auto& r : rows.as_array()) out += r.as_string() + "|";
  return out;
}

template <typename T>
std::string list_text(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string list_text(const Json& j) {
  std::string s = "[";
  for (size_t i = 0; i < j.as_array().size(); ++i) s += (i ? "," : "") + std::to_string(j.as_array()[i].as_int());
  return s + "]";
}

es::Mask mask_from(const Json& rows) {
  es::Mask m;
  m.rows = int(rows.as_array().size());
  m.cols = int(rows.as_array()[0].as_string().size());
  for (const auto& r : rows.as_array())
    for (char c : r.as_string()) m.data.push_back(c == '0' ? 0.0f : es::NEG_INF);
  return m;
}

// The fake K rows of make_fixed_vectors.fake_k, laid out [1, H, n, D] with each row padded to D + 2 elements (as an
// MLMultiArray with aligned rows would be), then read back through copy_box: the real rows [H, t, D].
std::vector<float> new_rows(const std::vector<int32_t>& positions, const es::CacheSpec& c, int t, bool v) {
  const int n = int(positions.size()), h_n = c.num_kv_heads, d_n = c.head_dim, row = d_n + 2;
  std::vector<float> out_buf(size_t(h_n) * n * row, 12345.0f);
  for (int h = 0; h < h_n; ++h)
    for (int r = 0; r < n; ++r)
      for (int d = 0; d < d_n; ++d) {
        const float k = float(((int64_t(positions[size_t(r)]) + 1) * 8 + c.layer) * 16 + h * 4 + d);
        out_buf[(size_t(h) * n + r) * row + d] = v ? -k - 0.5f : k;
      }
  es::StridedView view{out_buf.data(), es::DType::F32, {1, h_n, n, d_n},
                       {int64_t(h_n) * n * row, int64_t(n) * row, row, 1}};
  std::vector<float> rows(size_t(h_n) * t * d_n);
  es::copy_box(view, {{0, 1}, {0, h_n}, {0, t}, {0, d_n}}, rows.data());
  return rows;
}

void check_caches(const std::string& where, const es::FixedCaches& caches, const es::KVLayout& layout,
                  const Json& want) {
  for (size_t i = 0; i < layout.caches.size(); ++i) {
    const auto& c = layout.caches[i];
    const auto shape = caches.shape(i);
    for (int h = 0; h < c.num_kv_heads; ++h)
      for (int64_t s = 0; s < shape[2]; ++s) {
        const double got = caches.k_data(i)[(size_t(h) * shape[2] + size_t(s)) * size_t(c.head_dim)];
        const double expected = want.as_array()[i].as_array()[size_t(h)].as_array()[size_t(s)].as_number();
        if (got != expected) {
          expect(false, where, "cache " + std::to_string(i) + " head " + std::to_string(h) + " slot " +
                                   std::to_string(s) + ": " + std::to_string(got) + " != " + std::to_string(expected));
          return;
        }
      }
  }
  ++checks;
}

void replay(const Json& c) {
  const std::string name = c.at("name").as_string() + "/seed " + c.at("seed").dump();
  const es::KVLayout layout = es::layout_from_json(c.at("layout"));
  const bool state_binding = layout.binding == es::BINDING_STATE;
  const es::FixedShapes shapes = es::fixed_shapes(c.at("fixed"), layout, "Core ML package", "vectors", FIX);
  es::KVState state(layout);
  es::FixedCaches caches(layout, shapes.slots);
  std::vector<std::vector<float>> new_k(layout.caches.size()), new_v(layout.caches.size());
  int pending = 0;
  int i = 0;
  for (const auto& op : c.at("ops").as_array()) {
    const std::string kind = op.at("op").as_string();
    const std::string where = name + " op " + std::to_string(i++) + " " + kind;
    if (kind == "forward") {
      std::vector<int64_t> ids;
      for (const auto& x : op.at("ids").as_array()) ids.push_back(x.as_int());
      const int t = int(ids.size());
      const es::Masks masks = state.masks(t);
      std::vector<int64_t> positions;
      for (int r = 0; r < t; ++r) positions.push_back(state.length + r);
      const es::FixedPass p = es::plan_pass(shapes, layout, ids, positions, masks, es::NEG_INF, FIX);
      expect(p.n == op.at("n").as_int() && p.function == op.at("function").as_string(), where,
             "length " + std::to_string(p.n) + " " + p.function + " != " + op.at("n").dump() + " " +
                 op.at("function").dump());
      expect(list_text(p.ids) == list_text(op.at("padded_ids")), where,
             "ids " + list_text(p.ids) + " != " + list_text(op.at("padded_ids")));
      expect(list_text(p.positions) == list_text(op.at("positions")), where,
             "positions " + list_text(p.positions) + " != " + list_text(op.at("positions")));
      for (const auto& m : op.at("masks").as_object()) {
        const int cols = int(p.masks.at(m.first).size()) / p.n;
        const std::string got = rows_text(p.masks.at(m.first).data(), p.n, cols);
        expect(got == rows_text(m.second), where, m.first + " mask " + got + " != " + rows_text(m.second));
      }
      if (op.has("write_slots"))
        for (const auto& w : op.at("write_slots").as_object())
          expect(list_text(p.write_slots.at(w.first)) == list_text(w.second), where,
                 w.first + " write slots " + list_text(p.write_slots.at(w.first)) + " != " + list_text(w.second));
      if (state_binding) state.written(t);
      for (size_t k = 0; !state_binding && k < layout.caches.size(); ++k) {
        new_k[k] = new_rows(p.positions, layout.caches[k], t, false);
        new_v[k] = new_rows(p.positions, layout.caches[k], t, true);
      }
      pending = t;
    } else if (kind == "commit") {
      const int n = int(op.at("n").as_int());
      const es::CommitPlan plan = state.plan_commit(n);
      if (!state_binding) caches.commit(plan, new_k, new_v, pending);
      state.advance(n, plan);
      if (op.has("caches")) check_caches(where, caches, layout, op.at("caches"));
    } else if (kind == "draft") {
      expect(state.length == op.at("position").as_int(), where, "position " + std::to_string(state.length));
      const es::Masks masks = state.drafter_masks();
      for (const auto& m : op.at("masks").as_object()) {
        const auto got =
            es::drafter_mask(masks.at(m.first), layout.slots(m.first), shapes.slots.at(m.first), es::NEG_INF);
        expect(rows_text(got.data(), 1, int(got.size())) == rows_text(m.second), where,
               m.first + " drafter mask " + rows_text(got.data(), 1, int(got.size())) + " != " + rows_text(m.second));
      }
    } else if (kind == "rewind") {
      state.rewind(op.at("pos").as_int());
    } else if (kind == "reset") {
      state.reset();
    } else {
      expect(false, where, "unknown op");
    }
  }
  if (c.at("final").has("k"))
    for (size_t k = 0; k < layout.caches.size(); ++k) {
      bool same = true;
      const auto& want_k = c.at("final").at("k").as_array()[k].as_array();
      const auto& want_v = c.at("final").at("v").as_array()[k].as_array();
      same = want_k.size() == caches.k_data(k).size() && want_v.size() == caches.v_data(k).size();
      for (size_t j = 0; same && j < want_k.size(); ++j)
        same = caches.k_data(k)[j] == float(want_k[j].as_number()) &&
               caches.v_data(k)[j] == float(want_v[j].as_number());
      expect(same, name + " final", "cache " + std::to_string(k) + " K/V differ from Python's");
    }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const es::Error& err) {
    return err.what();
  }
  return "";
}

void pure(const Json& p) {
  for (const auto& c : p.at("length_for").as_array()) {
    const auto& v = c.as_array();
    es::FixedShapes s;
    for (const auto& t : v[0].as_array()) s.lengths[int(t.as_int())] = "f";
    int got = 0;
    const std::string err = error_of([&] { got = s.length_for(int(v[1].as_int()), FIX); });
    expect(err == v[3].as_string() && (!err.empty() || got == v[2].as_int()), "length_for " + c.dump(),
           "got " + std::to_string(got) + " '" + err + "'");
  }
  for (const auto& c : p.at("state_slots").as_array()) {
    const auto got = es::state_slots(es::layout_from_json(c.as_array()[0]));
    for (const auto& kind : c.as_array()[1].as_object())
      expect(got.at(kind.first) == kind.second.as_int(), "state_slots " + kind.first,
             std::to_string(got.at(kind.first)));
  }
  for (const auto& c : p.at("fixed_shapes").as_array()) {
    const auto& v = c.as_array();
    const std::string err =
        error_of([&] { es::fixed_shapes(v[1], es::layout_from_json(v[0]), "Core ML package", "m", FIX); });
    expect(err == v[2].as_string(), "fixed_shapes " + v[1].dump(), "'" + err + "' != '" + v[2].as_string() + "'");
  }
  for (const auto& c : p.at("slot_feeds").as_array()) {
    std::vector<int64_t> positions;
    for (const auto& x : c.at("positions").as_array()) positions.push_back(x.as_int());
    const int n = int(c.at("n").as_int()), s_f = int(c.at("s_f").as_int());
    const auto got = es::slot_feeds(mask_from(c.at("mask")), positions, n, int(c.at("s").as_int()), s_f,
                                    c.at("ring").as_bool(), es::NEG_INF);
    expect(rows_text(got.mask.data(), n, s_f) == rows_text(c.at("out")), "slot_feeds mask",
           rows_text(got.mask.data(), n, s_f));
    expect(list_text(got.index) == list_text(c.at("index")), "slot_feeds index", list_text(got.index));
  }
  for (const auto& c : p.at("half").as_array()) {
    const uint32_t fbits = uint32_t(c.as_array()[0].as_int());
    uint16_t want = uint16_t(c.as_array()[1].as_int());
    float f;
    std::memcpy(&f, &fbits, sizeof f);
    if (std::isfinite(f) && (want & 0x7FFF) == 0x7C00) want = uint16_t((want & 0x8000) | 0x7BFF);  // saturation
    const uint16_t got = es::float_to_half(f);
    expect(got == want, "float_to_half " + std::to_string(f), std::to_string(got) + " != " + std::to_string(want));
  }
}

void tensor_edges() {
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every half value survives half -> float -> half (NaNs stay NaN)
    const float f = es::half_to_float(uint16_t(h));
    const uint16_t back = es::float_to_half(f);
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
    if (nan ? !std::isnan(f) || (back & 0x7E00) != 0x7E00 : back != h) {
      expect(false, "half round trip", std::to_string(h) + " -> " + std::to_string(back));
      break;
    }
  }
  expect(es::half_to_float(0x3C00) == 1.0f && es::half_to_float(0xC000) == -2.0f &&
             es::half_to_float(0x7BFF) == 65504.0f && es::half_to_float(0x0001) == std::ldexp(1.0f, -24),
         "half_to_float", "known values");
  // an fp16 [2, 3] array with rows padded to 4 (as an ANE output can be), its column box [.., 1:3)
  const uint16_t half_buf[8] = {0x3C00, 0x4000, 0x4200, 0, 0x4400, 0x4500, 0x4600, 0};
  es::StridedView hv{half_buf, es::DType::F16, {2, 3}, {4, 1}};
  float out[4];
  es::copy_box(hv, {{0, 2}, {1, 3}}, out);
  expect(out[0] == 2 && out[1] == 3 && out[2] == 5 && out[3] == 6, "copy_box f16", "strided box");
  const int32_t ids[3] = {7, -1, 42};
  int64_t wide[3];
  es::copy_box(es::StridedView{ids, es::DType::I32, {3}, {1}}, es::whole({3}), wide);
  expect(wide[0] == 7 && wide[1] == -1 && wide[2] == 42, "copy_box i32", "ids");
  const double one = 1.5;
  float scalar = 0;
  es::copy_box(es::StridedView{&one, es::DType::F64, {}, {}}, {}, &scalar);
  expect(scalar == 1.5f, "copy_box rank 0", std::to_string(scalar));
  expect(!error_of([&] { es::copy_box(hv, {{0, 3}, {0, 3}}, out); }).empty(), "copy_box",
         "a box past the shape is refused");
  expect(!error_of([&] { es::copy_box(hv, es::whole({2, 3}), wide); }).empty(), "copy_box",
         "fp16 read as ids is refused");
  es::StridedView short_buf = hv;  // strides that reach past the buffer (an inconsistent array) are refused
  short_buf.bytes = 10;
  expect(!error_of([&] { es::copy_box(short_buf, es::whole({2, 3}), out); }).empty(), "copy_box",
         "a view past its buffer is refused");
  uint16_t halves[2];
  const float mask[2] = {0.0f, es::NEG_INF};
  es::convert(mask, 2, es::DType::F16, halves);
  expect(halves[0] == 0 && halves[1] == 0xFBFF, "convert f16", "NEG_INF saturates to -65504");
  expect(es::contiguous_strides({1, 2, 3, 4}) == std::vector<int64_t>({24, 12, 4, 1}), "contiguous_strides", "");
  expect(es::fixed_dims(es::TensorSpec{"m", "float32", {"1", "1", "T", "S_full+T"}}, 5, {{"full", 30}}) ==
             std::vector<int64_t>({1, 1, 5, 35}),
         "fixed_dims", "S_full+T");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "runtimes/native/tests/vectors/fixed_cases.json";
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "error: %s cannot be read\n  fix: run from the repository root, or pass the file\n", path.c_str());
    return 2;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const Json doc = Json::parse(ss.str());
  if (doc.at("version").as_int() != 1) {
    std::fprintf(stderr, "error: %s has vector version %s, this test reads 1\n", path.c_str(), doc.at("version").dump().c_str());
    return 2;
  }
  int cases = 0;
  try {
    for (const auto& c : doc.at("cases").as_array()) {
      replay(c);
      ++cases;
    }
    pure(doc.at("pure"));
    tensor_edges();
  } catch (const std::exception& err) {
    std::fprintf(stderr, "FAIL: an unexpected error: %s\n", err.what());
    return 1;
  }
  if (failures) {
    std::fprintf(stderr, "fixed vectors: %d of %d checks failed\n", failures, checks);
    return 1;
  }
  std::printf("fixed vectors: %d cases, %d checks, all equal\n", cases, checks);
  return 0;
}
