// Row-major GEMM over cuBLASLt (the twin of src/ops/cpu/blas.h), strided-batched, fp32
// compute and scale, with an optional bias epilogue:
//   C[i] (M, N) = alpha * op(A[i]) (M, K) @ op(B[i]) (K, N) + beta * C[i] (+ bias (N) per row)
// for i < batch, X[i] = X + i * stride_x (strides in elements, ignored when batch == 1).
// The whole right-hand side is fp32 and rounded to TC once (cuBLASLt's epilogue; split-K
// partials stay fp32); a bias that is not 16-byte aligned is first copied to an aligned scratch
// slot, so the epilogue handles every bias. Where cuBLASLt has no algorithm, a SIMT kernel with
// the same single rounding takes over (counted: gemm_fallback_count()).
// Supported (TAB, TC): (float, float) true fp32 (no TF32), (bf16, bf16) and (bf16, float), the
// latter for fp32 parameter gradients and fp32 attention scores from bf16 operands.
#pragma once
#include "ops/cuda/common.cuh"

namespace vit::cuda {

template <typename TAB, typename TC>
void gemm(bool trans_a, bool trans_b, Index M, Index N, Index K, float alpha, const TAB* A,
          Index lda, Index stride_a, const TAB* B, Index ldb, Index stride_b, float beta, TC* C,
          Index ldc, Index stride_c, Index batch = 1, const TC* bias = nullptr);

}  // namespace vit::cuda
