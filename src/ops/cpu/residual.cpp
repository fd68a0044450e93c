// Residual add of a block branch with optional layer scale (gamma) and stochastic depth
// (a per-sample scale of 0 or 1/keep_prob).
#include <omp.h>

#include <vector>

#include "ops/cpu/blas.h"
#include "ops/cpu/ops.h"

namespace vit::cpu {

template <typename T>
void residual_forward(T* out, const T* x, const T* branch, const T* gamma, const T* sample_scale,
                      Index B, Index S, Index C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (Index b = 0; b < B; ++b) {
    for (Index s = 0; s < S; ++s) {
      const T k = sample_scale ? sample_scale[b] : T(1);
      const Index o = (b * S + s) * C;
      if (gamma) {
#pragma omp simd
        for (Index c = 0; c < C; ++c) out[o + c] = x[o + c] + k * gamma[c] * branch[o + c];
      } else {
#pragma omp simd
        for (Index c = 0; c < C; ++c) out[o + c] = x[o + c] + k * branch[o + c];
      }
    }
  }
}

template <typename T>
void residual_backward(T* dbranch, T* dgamma, const T* dout, const T* branch, const T* gamma,
                       const T* sample_scale, Index B, Index S, Index C) {
  const int nthreads = omp_get_max_threads();
  std::vector<T> partial(dgamma ? size_t(nthreads) * C : 0, T(0));  // (threads, C)
#pragma omp parallel
  {
    T* dg_t = dgamma ? partial.data() + size_t(omp_get_thread_num()) * C : nullptr;
#pragma omp for collapse(2) schedule(static)
    for (Index b = 0; b < B; ++b) {
      for (Index s = 0; s < S; ++s) {
        const T k = sample_scale ? sample_scale[b] : T(1);
        const Index o = (b * S + s) * C;
        for (Index c = 0; c < C; ++c) {
          const T g = gamma ? gamma[c] : T(1);
          if (dbranch) dbranch[o + c] = k * g * dout[o + c];
          if (dg_t) dg_t[c] += k * branch[o + c] * dout[o + c];
        }
      }
    }
  }
  if (dgamma)
    for (int t = 0; t < nthreads; ++t)
      for (Index c = 0; c < C; ++c) dgamma[c] += partial[size_t(t) * C + c];
}

#define INSTANTIATE(T)                                                                             \
  template void residual_forward<T>(T*, const T*, const T*, const T*, const T*, Index, Index,      \
                                    Index);                                                        \
  template void residual_backward<T>(T*, T*, const T*, const T*, const T*, const T*, Index, Index, \
                                     Index);
VIT_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace vit::cpu
