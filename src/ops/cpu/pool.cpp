// Classifier pooling: the class token, or the mean of the patch tokens.
#include "ops/cpu/blas.h"
#include "ops/cpu/ops.h"

namespace vit::cpu {

template <typename T>
void pool_forward(T* out, const T* x, Index B, Index N, Index prefix, Index C, bool avg) {
#pragma omp parallel for schedule(static)
  for (Index b = 0; b < B; ++b) {
    T* o = out + b * C;  // (C)
    if (!avg) {
      for (Index c = 0; c < C; ++c) o[c] = x[b * N * C + c];
      continue;
    }
    for (Index c = 0; c < C; ++c) o[c] = T(0);
    for (Index n = prefix; n < N; ++n)
      for (Index c = 0; c < C; ++c) o[c] += x[(b * N + n) * C + c];
    const T inv = T(1) / T(N - prefix);
    for (Index c = 0; c < C; ++c) o[c] *= inv;
  }
}

template <typename T>
void pool_backward(T* dx, const T* dout, Index B, Index N, Index prefix, Index C, bool avg) {
#pragma omp parallel for schedule(static)
  for (Index b = 0; b < B; ++b) {
    const T* g = dout + b * C;
    if (!avg) {
      for (Index c = 0; c < C; ++c) dx[b * N * C + c] += g[c];
      continue;
    }
    const T inv = T(1) / T(N - prefix);
    for (Index n = prefix; n < N; ++n)
      for (Index c = 0; c < C; ++c) dx[(b * N + n) * C + c] += g[c] * inv;
  }
}

#define INSTANTIATE(T)                                                           \
  template void pool_forward<T>(T*, const T*, Index, Index, Index, Index, bool); \
  template void pool_backward<T>(T*, const T*, Index, Index, Index, Index, bool);
VIT_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace vit::cpu
