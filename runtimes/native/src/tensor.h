// tensor.h - element types and strided copies between a runtime's arrays and the runner's contiguous float / int
// buffers. Plain C++ (no runtime's types), so that what a backend does to the bytes it hands over or reads back is
// unit-tested on every platform (tests/fixed_vectors_test.cpp); the Core ML backend reads MLMultiArrays through it
// (their outputs may be fp16 and padded: strides are in elements, as MLMultiArray.strides gives them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace es {

enum class DType { F32, F16, F64, I32 };

const char* dtype_name(DType type);  // "float32", "float16", "float64", "int32"
size_t dtype_size(DType type);

// IEEE binary16 <-> binary32. float_to_half rounds to nearest even (numpy's astype(float16)), except that finite
// values beyond the half range saturate to +-65504 instead of turning into +-inf: a mask's finite NEG_INF stays
// finite in an fp16 input, so a fully masked row can never turn into NaN there either. inf and NaN are kept.
uint16_t float_to_half(float value);
float half_to_float(uint16_t bits);

// A read-only strided array: element (i_0, ..., i_k) sits at data + sum_d i_d * strides[d] elements of `type`.
struct StridedView {
  const void* data = nullptr;
  DType type = DType::F32;
  std::vector<int64_t> shape, strides;
  size_t bytes = 0;  // the buffer's size when known (0: unknown): copy_box refuses a view that reaches past it
};

using Box = std::vector<std::pair<int64_t, int64_t>>;  // per dimension [lo, hi)

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);  // row-major
// Copies the box of `src` into `dst`, contiguous and row-major over the box, converted to float / int64. Throws
// Error(Code::Backend) when the box does not fit the shape (a graph whose output is not the declared shape), when
// the strides reach past `bytes`, or when an integer output is read as float (or the reverse: the graph's declared
// type is wrong).
void copy_box(const StridedView& src, const Box& box, float* dst);
void copy_box(const StridedView& src, const Box& box, int64_t* dst);
Box whole(const std::vector<int64_t>& shape);

// Contiguous runner values -> contiguous `type` (the element type a graph declares for an input).
void convert(const float* src, size_t n, DType type, void* dst);    // F32, F16 (saturating), F64
void convert(const int32_t* src, size_t n, DType type, void* dst);  // I32, or F32 / F16 / F64 (exact below 2048 in F16)

}  // namespace es
