// Multi-head self-attention core. One (batch, head) pair per OpenMP iteration; its three GEMMs
// read q, k, v straight out of the (B, N, 3C) qkv buffer through leading dimensions, so there is
// no permute/copy. OpenBLAS (OpenMP build) runs single-threaded inside the parallel region.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/blas.h"
#include "ops/cpu/fast_math.h"
#include "ops/cpu/ops.h"

namespace vit::cpu {

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, Index B, Index N, Index H, Index D) {
  const Index C = H * D, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(D));
#pragma omp parallel for collapse(2) schedule(static)
  for (Index b = 0; b < B; ++b) {
    for (Index h = 0; h < H; ++h) {
      const T* q = qkv + b * N * C3 + h * D;  // (N, D), row stride 3C
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* p = att + (b * H + h) * N * N;  // (N, N)
      gemm(false, true, N, N, D, scale, q, C3, k, C3, T(0), p, N);
      for (Index i = 0; i < N; ++i) {
        T* row = p + i * N;
        T mx = row[0];
        for (Index j = 1; j < N; ++j) mx = std::max(mx, row[j]);
        // Vectorised exp: libm's expf takes a slow path for every score that underflows,
        // and trained attention is sharp enough to make that most of them.
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (Index j = 0; j < N; ++j) {
          row[j] = exp_any(row[j] - mx);
          sum += row[j];
        }
        const T inv = T(1) / sum;
        for (Index j = 0; j < N; ++j) row[j] *= inv;
      }
      T* o = out + b * N * C + h * D;  // (N, D), row stride C
      gemm(false, false, N, D, N, T(1), p, N, v, C3, T(0), o, C);
    }
  }
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, Index B, Index N,
                        Index H, Index D) {
  const Index C = H * D, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(D));
#pragma omp parallel
  {
    std::vector<T> ds(size_t(N) * N);  // (N, N) scratch: dP, then dS
#pragma omp for collapse(2) schedule(static)
    for (Index b = 0; b < B; ++b) {
      for (Index h = 0; h < H; ++h) {
        const T* q = qkv + b * N * C3 + h * D;
        const T* k = q + C;
        const T* v = q + 2 * C;
        T* dq = dqkv + b * N * C3 + h * D;
        T* dk = dq + C;
        T* dv = dq + 2 * C;
        const T* p = att + (b * H + h) * N * N;                              // (N, N)
        const T* dO = dout + b * N * C + h * D;                              // (N, D), row stride C
        gemm(true, false, N, D, N, T(1), p, N, dO, C, T(0), dv, C3);         // dV = P^T dO
        gemm(false, true, N, N, D, T(1), dO, C, v, C3, T(0), ds.data(), N);  // dP = dO V^T
        for (Index i = 0; i < N; ++i) {  // softmax backward, times the score scale
          const T* pr = p + i * N;
          T* dr = ds.data() + i * N;
          T dot = 0;
          for (Index j = 0; j < N; ++j) dot += pr[j] * dr[j];
          for (Index j = 0; j < N; ++j) dr[j] = pr[j] * (dr[j] - dot) * scale;
        }
        gemm(false, false, N, D, N, T(1), ds.data(), N, k, C3, T(0), dq, C3);  // dQ = dS K
        gemm(true, false, N, D, N, T(1), ds.data(), N, q, C3, T(0), dk, C3);   // dK = dS^T Q
      }
    }
  }
}

#define INSTANTIATE(T)                                                              \
  template void attention_forward<T>(T*, T*, const T*, Index, Index, Index, Index); \
  template void attention_backward<T>(T*, const T*, const T*, const T*, Index, Index, Index, Index);
VIT_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace vit::cpu
