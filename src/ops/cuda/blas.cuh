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
// gemm_simt (ops.h): the same on the SIMT kernel gemm() falls back to.

// The GELU epilogues (bf16; cuBLASLt's GELU is the tanh form, which the probe
// CublasLtEpilogue.GeluIsTheErfOrTheTanhFormula checks on the device). Both return false, with
// nothing enqueued, where cuBLASLt has no algorithm or the operands do not fit (ld_aux not a
// multiple of 8, a misaligned bias gradient): the caller then runs the GEMM
// and the activation as separate ops.
// Forward: aux (M, N; ld_aux) = A (M, K) @ op(B) + bias (N), C (M, N) = gelu_tanh(aux), each
// rounded once from fp32.
template <typename T>
bool gemm_gelu_tanh_aux(bool trans_b, Index M, Index N, Index K, const T* A, Index lda, const T* B,
                        Index ldb, T* C, Index ldc, const T* bias, T* aux, Index ld_aux);
// Backward: C (M, N) = gelu_tanh'(aux) * (A (M, K) @ op(B)), rounded once from fp32; dbias (N, in
// T, overwritten) = the column sums of C.
template <typename T>
bool gemm_dgelu_tanh_bgrad(bool trans_b, Index M, Index N, Index K, const T* A, Index lda,
                           const T* B, Index ldb, T* C, Index ldc, const T* aux, Index ld_aux,
                           T* dbias);

}  // namespace vit::cuda
