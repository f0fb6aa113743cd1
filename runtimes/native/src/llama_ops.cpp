// llama_ops.cpp - the `llama::` kernels the bundles' programs call, registered with ExecuTorch's operator registry.
//
// The executorch wheel's C++ libraries carry no `llama::` operators (they live in its Python-side custom-ops
// library), so a native runner brings the ones its bundles use. exporters/executorch.py writes each forward's new
// K/V rows with `llama::update_cache_with_indices` (the "slots" attention form); the "sdpa" form's
// `llama::custom_sdpa` is not provided: such a bundle fails to load with "Missing operator: llama::custom_sdpa.out",
// which the backend turns into an error naming the file and the fix (re-export with the default attention form).
#include <cstring>

#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>

namespace es {
namespace {

using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;

// value: [B, T, H, D]; cache: [B, S, H, D] (written in place); indices: [B, T] int64 slot of each new row.
// cache[b, indices[b, t]] = value[b, t]. start_pos is unused when indices are given (as in ExecuTorch's kernel).
// out: a [1] placeholder the graph ignores.
Tensor& update_cache_with_indices_out(KernelRuntimeContext& ctx, const Tensor& value, Tensor& cache,
                                      int64_t start_pos, const Tensor& indices, Tensor& out) {
  (void)start_pos;
  ET_KERNEL_CHECK(ctx, value.dim() == 4 && cache.dim() == 4 && indices.dim() == 2, InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, value.scalar_type() == cache.scalar_type(), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, indices.scalar_type() == executorch::aten::ScalarType::Long, InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, value.size(0) == cache.size(0) && value.size(2) == cache.size(2) && value.size(3) == cache.size(3),
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, indices.size(0) == value.size(0) && indices.size(1) == value.size(1), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, executorch::runtime::tensor_is_contiguous(value) &&
                           executorch::runtime::tensor_is_contiguous(cache) &&
                           executorch::runtime::tensor_is_contiguous(indices),
                  InvalidArgument, out);
  const int64_t batch = value.size(0), t_new = value.size(1), slots = cache.size(1);
  const size_t row_bytes = size_t(value.size(2) * value.size(3)) * size_t(value.element_size());
  const int64_t* slot = indices.const_data_ptr<int64_t>();
  const char* src = static_cast<const char*>(value.const_data_ptr());
  char* dst = static_cast<char*>(cache.mutable_data_ptr());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < t_new; ++t) {
      const int64_t s = slot[b * t_new + t];
      ET_KERNEL_CHECK(ctx, s >= 0 && s < slots, InvalidArgument, out);
      std::memcpy(dst + size_t(b * slots + s) * row_bytes, src + size_t(b * t_new + t) * row_bytes, row_bytes);
    }
  }
  return out;
}

}  // namespace

// Referenced by the ExecuTorch backend so that a static link keeps this object (and its registration) in.
int llama_ops_registered() { return 1; }

}  // namespace es

EXECUTORCH_LIBRARY(llama, "update_cache_with_indices.out", es::update_cache_with_indices_out);
