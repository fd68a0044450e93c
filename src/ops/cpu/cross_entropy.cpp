// Softmax cross-entropy on soft targets, stable for large logits (log-sum-exp with the row max).
#include <algorithm>
#include <cmath>

#include "ops/cpu/blas.h"
#include "ops/cpu/ops.h"

namespace vit::cpu {

template <typename T>
void cross_entropy_forward(T* losses, T* probs, const T* logits, const T* targets, Index B,
                           Index K) {
#pragma omp parallel for schedule(static)
  for (Index b = 0; b < B; ++b) {
    const T* z = logits + b * K;  // (K)
    const T* t = targets + b * K;
    T* p = probs + b * K;
    T mx = z[0];
    for (Index k = 1; k < K; ++k) mx = std::max(mx, z[k]);
    double sum = 0;
    for (Index k = 0; k < K; ++k) sum += std::exp(double(z[k] - mx));
    const double lse = std::log(sum);  // log sum exp(z - mx)
    double loss = 0;
    for (Index k = 0; k < K; ++k) {
      const double logp = double(z[k] - mx) - lse;
      p[k] = T(std::exp(logp));
      loss -= double(t[k]) * logp;
    }
    losses[b] = T(loss);
  }
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* probs, const T* targets, T dloss, Index B,
                            Index K) {
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < B * K; ++i) dlogits[i] = (probs[i] - targets[i]) * dloss;
}
// Note: d/dz of -sum_k t_k log softmax(z)_k is softmax(z) * sum_k t_k - t; targets are
// probability vectors (sum 1), which every caller guarantees.

#define INSTANTIATE(T)                                                              \
  template void cross_entropy_forward<T>(T*, T*, const T*, const T*, Index, Index); \
  template void cross_entropy_backward<T>(T*, const T*, const T*, T, Index, Index);
VIT_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace vit::cpu
