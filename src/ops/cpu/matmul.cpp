// Linear layers as GEMMs through OpenBLAS.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/blas.h"
#include "ops/cpu/ops.h"

namespace vit::cpu {

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, Index M, Index K,
                    Index Nout) {
  // out (M, Nout) = inp (M, K) @ weight^T, then the bias broadcast over rows.
  gemm(false, true, M, Nout, K, T(1), inp, K, weight, K, T(0), out, Nout);
  if (bias) {
#pragma omp parallel for schedule(static)
    for (Index m = 0; m < M; ++m) {
      T* row = out + m * Nout;
      for (Index n = 0; n < Nout; ++n) row[n] += bias[n];
    }
  }
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     Index M, Index K, Index Nout) {
  // dinp (M, K) = dout (M, Nout) @ weight (Nout, K)
  if (dinp) gemm(false, false, M, K, Nout, T(1), dout, Nout, weight, K, T(0), dinp, K);
  // dweight (Nout, K) += dout^T @ inp
  if (dweight) gemm(true, false, Nout, K, M, T(1), dout, Nout, inp, K, T(1), dweight, K);
  if (dbias) {
    // Column sums: each thread owns a slice of columns, rows are walked in order (deterministic).
#pragma omp parallel
    {
      const int nt = omp_get_num_threads();
      const int t = omp_get_thread_num();
      const Index lo = Nout * t / nt, hi = Nout * (t + 1) / nt;
      for (Index m = 0; m < M; ++m) {
        const T* row = dout + m * Nout;
        for (Index n = lo; n < hi; ++n) dbias[n] += row[n];
      }
    }
  }
}

#define INSTANTIATE(T)                                                                    \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, Index, Index, Index); \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, Index, Index, Index);
VIT_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace vit::cpu
