// Row-major GEMM wrapper over CBLAS for float and double, so the templated ops call one name.
// C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, with leading dimensions given so
// strided views (one head inside a (B, N, 3C) qkv buffer) need no copies.
#pragma once
#include <cblas.h>

#include "core/common.h"

namespace vit::cpu {

inline void gemm(bool trans_a, bool trans_b, Index M, Index N, Index K, float alpha, const float* A,
                 Index lda, const float* B, Index ldb, float beta, float* C, Index ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

inline void gemm(bool trans_a, bool trans_b, Index M, Index N, Index K, double alpha,
                 const double* A, Index lda, const double* B, Index ldb, double beta, double* C,
                 Index ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace vit::cpu

// Explicit instantiation of an op template for float and double.
#define VIT_INSTANTIATE_FLOAT_DOUBLE(MACRO) \
  MACRO(float)                              \
  MACRO(double)
