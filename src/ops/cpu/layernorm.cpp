// LayerNorm over channels. Statistics are accumulated in double with a two-pass variance so rows
// with a large mean and a tiny spread (mean 1e3, std 1e-2) still normalise to fp32 accuracy.
#include <omp.h>

#include <cmath>
#include <vector>

#include "ops/cpu/blas.h"
#include "ops/cpu/ops.h"

namespace vit::cpu {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       Index R, Index C, T eps) {
#pragma omp parallel for schedule(static)
  for (Index r = 0; r < R; ++r) {
    const T* x = inp + r * C;  // (C)
    T* y = out + r * C;        // (C)
    double sum = 0;
    for (Index c = 0; c < C; ++c) sum += x[c];
    const double mu = sum / C;
    double sq = 0;
    for (Index c = 0; c < C; ++c) {
      const double d = x[c] - mu;
      sq += d * d;
    }
    const double rs = 1.0 / std::sqrt(sq / C + double(eps));
    // x - mean in double: the fp32-rounded mean of a row at 1e3 is off by up to 3e-5, which is
    // 0.3% of a 1e-2 spread.
    for (Index c = 0; c < C; ++c) y[c] = T((double(x[c]) - mu) * rs) * weight[c] + bias[c];
    mean[r] = T(mu);
    rstd[r] = T(rs);
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, Index R, Index C) {
  const int nthreads = omp_get_max_threads();
  // Per-thread partial sums for dweight/dbias, reduced in thread order (deterministic).
  std::vector<T> partial(size_t(nthreads) * 2 * C, T(0));  // (threads, 2, C)
#pragma omp parallel
  {
    const int t = omp_get_thread_num();
    T* dw_t = partial.data() + size_t(t) * 2 * C;  // (C)
    T* db_t = dw_t + C;                            // (C)
#pragma omp for schedule(static)
    for (Index r = 0; r < R; ++r) {
      const T* x = inp + r * C;
      const T* dy = dout + r * C;
      T* dx = dinp + r * C;
      // The mean again in double (see the forward); the saved one is fp32-rounded.
      double sum = 0;
      for (Index c = 0; c < C; ++c) sum += x[c];
      const double mu = sum / C;
      const T rs = rstd[r];
      // dnorm = dy * w; dx = rs * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
      double sum_dn = 0, sum_dn_xh = 0;
      for (Index c = 0; c < C; ++c) {
        const T xh = T((double(x[c]) - mu) * rs);
        const T dn = dy[c] * weight[c];
        sum_dn += dn;
        sum_dn_xh += double(dn) * xh;
        dw_t[c] += dy[c] * xh;
        db_t[c] += dy[c];
      }
      const T m_dn = T(sum_dn / C), m_dn_xh = T(sum_dn_xh / C);
      for (Index c = 0; c < C; ++c) {
        const T xh = T((double(x[c]) - mu) * rs);
        dx[c] += rs * (dy[c] * weight[c] - m_dn - xh * m_dn_xh);
      }
    }
  }
  for (int t = 0; t < nthreads; ++t) {
    const T* dw_t = partial.data() + size_t(t) * 2 * C;
    for (Index c = 0; c < C; ++c) {
      if (dweight) dweight[c] += dw_t[c];
      if (dbias) dbias[c] += dw_t[C + c];
    }
  }
}

#define INSTANTIATE(T)                                                                           \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, Index, Index, T); \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,        \
                                      const T*, Index, Index);
VIT_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace vit::cpu
