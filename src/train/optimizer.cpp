#include "train/optimizer.h"

#include <cmath>

namespace vit {

template <typename T>
double global_grad_norm(const T* grads, Index n) {
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (Index i = 0; i < n; ++i) sum += double(grads[i]) * double(grads[i]);
  return std::sqrt(sum);
}

template <typename T>
AdamW<T>::AdamW(Index n, Index num_decay_, AdamWConfig cfg_)
    : m(n, T(0)), v(n, T(0)), cfg(cfg_), num_decay(num_decay_) {}

template <typename T>
double AdamW<T>::step(T* params, const T* grads, double lr) {
  const Index n = Index(m.size());
  const double norm = global_grad_norm(grads, n);
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  double gscale = 1.0;
  if (cfg.clip_grad > 0) gscale = std::min(1.0, cfg.clip_grad / (norm + 1e-6));
  ++step_;
  // torch.optim.AdamW (single-tensor): decay, moments, bias-corrected step.
  const T b1 = T(cfg.beta1), b2 = T(cfg.beta2), eps = T(cfg.eps), gs = T(gscale);
  const T decay = T(1.0 - lr * cfg.weight_decay);
  const T step_size = T(lr / (1.0 - std::pow(cfg.beta1, double(step_))));
  const T bc2_sqrt = T(std::sqrt(1.0 - std::pow(cfg.beta2, double(step_))));
  T* mp = m.data();
  T* vp = v.data();
  const Index nd = num_decay;
#pragma omp parallel for simd schedule(static)
  for (Index i = 0; i < n; ++i) {
    const T g = grads[i] * gs;
    T p = params[i];
    if (i < nd) p *= decay;
    const T mi = b1 * mp[i] + (T(1) - b1) * g;
    const T vi = b2 * vp[i] + (T(1) - b2) * g * g;
    mp[i] = mi;
    vp[i] = vi;
    params[i] = p - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
  return norm;
}

template class AdamW<float>;
template class AdamW<double>;
template double global_grad_norm<float>(const float*, Index);
template double global_grad_norm<double>(const double*, Index);

}  // namespace vit
