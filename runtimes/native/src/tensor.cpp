// tensor.cpp - see tensor.h.
#include "tensor.h"

#include <cmath>
#include <cstring>

#include "errors.h"

namespace es {

namespace {

constexpr uint32_t F32_INF = 0x7F800000u;
constexpr uint32_t HALF_OVERFLOW = 0x477FF000u;  // 65520: rounds to +inf in binary16 (65504 + half an ulp, a tie)
constexpr uint32_t HALF_MIN_NORMAL = 0x38800000u;  // 2^-14
constexpr uint32_t HALF_HALF_MIN_SUB = 0x33000000u;  // 2^-25: half of the smallest subnormal (a tie: rounds to 0)

// Round `h` up by one when the dropped bits `rem` (of `bits` bits) are above half, or exactly half and h is odd.
uint32_t round_even(uint32_t h, uint32_t rem, int bits) {
  const uint32_t half = 1u << (bits - 1);
  return (rem > half || (rem == half && (h & 1u))) ? h + 1 : h;
}

float load(const float* p) { return *p; }
float load(const double* p) { return float(*p); }
float load(const uint16_t* p) { return half_to_float(*p); }
int64_t load_int(const int32_t* p) { return *p; }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void check_box(const StridedView& src, const Box& box) {
  bool ok = box.size() == src.shape.size() && src.strides.size() == src.shape.size() && src.data != nullptr;
  for (size_t d = 0; ok && d < box.size(); ++d)
    ok = box[d].first >= 0 && box[d].first <= box[d].second && box[d].second <= src.shape[d];
  if (!ok)
    throw backend_error("an output of shape " + shape_text(src.shape) + " (" + dtype_name(src.type) +
                            ") cannot be read as the declared shape",
                        "re-export the bundle (its graph does not produce what its manifest says)");
  int64_t last = 0;  // the farthest element the view addresses
  bool negative = false;
  for (size_t d = 0; d < src.shape.size(); ++d) {
    negative = negative || src.strides[d] < 0;
    if (src.shape[d] > 0) last += (src.shape[d] - 1) * src.strides[d];
  }
  if (negative || (src.bytes && size_t(last + 1) * dtype_size(src.type) > src.bytes))
    throw backend_error("an output of shape " + shape_text(src.shape) + " and strides " + shape_text(src.strides) +
                            " reaches past its " + std::to_string(src.bytes) + "-byte buffer",
                        "report this (the runtime returned an inconsistent array)");
}

// The box, row-major, innermost dimension in one loop; `read(offset_in_elements)` converts one element.
template <typename Out, typename Read>
void walk(const StridedView& src, const Box& box, Out* dst, Read read) {
  const size_t rank = box.size();
  size_t total = 1;
  for (const auto& r : box) total *= size_t(r.second - r.first);
  if (total == 0) return;
  if (rank == 0) {
    *dst = read(0);
    return;
  }
  std::vector<int64_t> idx(rank);
  for (size_t d = 0; d < rank; ++d) idx[d] = box[d].first;
  const int64_t inner_lo = box[rank - 1].first, inner_hi = box[rank - 1].second, inner_stride = src.strides[rank - 1];
  for (;;) {
    int64_t base = 0;
    for (size_t d = 0; d + 1 < rank; ++d) base += idx[d] * src.strides[d];
    for (int64_t i = inner_lo; i < inner_hi; ++i) *dst++ = read(base + i * inner_stride);
    size_t d = rank - 1;  // advance the outer index (odometer)
    while (d > 0) {
      --d;
      if (++idx[d] < box[d].second) break;
      idx[d] = box[d].first;
      if (d == 0) return;
    }
    if (rank == 1) return;
  }
}

}  // namespace

const char* dtype_name(DType type) {
  switch (type) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::F64: return "float64";
    case DType::I32: return "int32";
  }
  return "?";
}

size_t dtype_size(DType type) {
  switch (type) {
    case DType::F16: return 2;
    case DType::F64: return 8;
    default: return 4;
  }
}

uint16_t float_to_half(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a >= F32_INF) return uint16_t(sign | (a > F32_INF ? 0x7E00u : 0x7C00u));  // NaN (quiet), inf
  if (a >= HALF_OVERFLOW) return uint16_t(sign | 0x7BFFu);                      // saturate: +-65504
  if (a >= HALF_MIN_NORMAL) {                                                   // a normal half
    const uint32_t h = ((((a >> 23) - 112u) << 10) | ((a & 0x7FFFFFu) >> 13));
    return uint16_t(sign | round_even(h, a & 0x1FFFu, 13));  // a carry into the exponent is the right answer
  }
  if (a <= HALF_HALF_MIN_SUB) return sign;  // rounds to (signed) zero
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;  // a subnormal half: value = mant * 2^(e - 150), units 2^-24
  const int shift = 126 - int(a >> 23);                // 14 .. 24
  return uint16_t(sign | round_even(mant >> shift, mant & ((1u << shift) - 1u), shift));
}

float half_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16, exp = (bits >> 10) & 0x1Fu, mant = bits & 0x3FFu;
  uint32_t x;
  if (exp == 0x1F) {
    x = sign | F32_INF | (mant << 13);
  } else if (exp == 0) {
    const float v = std::ldexp(float(mant), -24);  // subnormal (or zero): exact in float
    return sign ? -v : v;
  } else {
    x = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

Box whole(const std::vector<int64_t>& shape) {
  Box box;
  for (int64_t n : shape) box.emplace_back(0, n);
  return box;
}

void copy_box(const StridedView& src, const Box& box, float* dst) {
  check_box(src, box);
  switch (src.type) {
    case DType::F32: {
      const float* p = static_cast<const float*>(src.data);
      return walk(src, box, dst, [p](int64_t o) { return load(p + o); });
    }
    case DType::F16: {
      const uint16_t* p = static_cast<const uint16_t*>(src.data);
      return walk(src, box, dst, [p](int64_t o) { return load(p + o); });
    }
    case DType::F64: {
      const double* p = static_cast<const double*>(src.data);
      return walk(src, box, dst, [p](int64_t o) { return load(p + o); });
    }
    case DType::I32: break;
  }
  throw backend_error("an int32 output where the manifest declares a float one",
                      "re-export the bundle (its graph does not produce what its manifest says)");
}

void copy_box(const StridedView& src, const Box& box, int64_t* dst) {
  check_box(src, box);
  if (src.type != DType::I32)
    throw backend_error(std::string("a ") + dtype_name(src.type) + " output where the manifest declares token ids",
                        "re-export the bundle (its graph does not produce what its manifest says)");
  const int32_t* p = static_cast<const int32_t*>(src.data);
  walk(src, box, dst, [p](int64_t o) { return load_int(p + o); });
}

void convert(const float* src, size_t n, DType type, void* dst) {
  switch (type) {
    case DType::F32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = float_to_half(src[i]);
      return;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) static_cast<double*>(dst)[i] = double(src[i]);
      return;
    case DType::I32: break;
  }
  throw backend_error("a graph declares an int32 input where the contract has a float one",
                      "re-export the bundle (its graph does not take what its manifest says)");
}

void convert(const int32_t* src, size_t n, DType type, void* dst) {
  switch (type) {
    case DType::I32: std::memcpy(dst, src, n * sizeof(int32_t)); return;
    case DType::F32:
      for (size_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = float(src[i]);
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = float_to_half(float(src[i]));
      return;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) static_cast<double*>(dst)[i] = double(src[i]);
      return;
  }
}

}  // namespace es
