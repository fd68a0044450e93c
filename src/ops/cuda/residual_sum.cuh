// The residual stream's update x + k g b, shared by the residual kernels (residual.cu) and the
// LayerNorm that fuses the add before it (layernorm.cu), so both give the same bits.
#pragma once

namespace vit::cuda {

// x + kg b, rounded after the product and after the sum: nvcc contracts the plain expression
// into an fma in one kernel and not in another (the scalar and the packed kernel differed in
// the last bit on an H200), and these intrinsics are never contracted.
__device__ __forceinline__ float residual_sum(float x, float kg, float b) {
  return __fadd_rn(x, __fmul_rn(kg, b));
}

}  // namespace vit::cuda
