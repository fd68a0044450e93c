#include "ops/cpu/adamw.h"

#include <algorithm>
#include <cmath>

namespace vit {

template <typename T>
double grad_sum_of_squares(const T* grads, Index n) {
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (Index i = 0; i < n; ++i) sum += double(grads[i]) * double(grads[i]);
  return sum;
}

template <typename T>
double global_grad_norm(const T* grads, Index n) {
  return std::sqrt(grad_sum_of_squares(grads, n));
}

double clip_scale(const AdamWConfig& cfg, double norm) {
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  return cfg.clip_grad > 0 ? std::min(1.0, cfg.clip_grad / (norm + 1e-6)) : 1.0;
}

namespace cpu {

template <typename T>
void adamw_update(T* params, T* mp, T* vp, const T* grads, Index n, Index nd,
                  const AdamWConfig& cfg, double lr, Index step, double grad_scale) {
  // torch.optim.AdamW (single-tensor): decay, moments, bias-corrected step.
  const T b1 = T(cfg.beta1), b2 = T(cfg.beta2), eps = T(cfg.eps), gs = T(grad_scale);
  const T decay = T(1.0 - lr * cfg.weight_decay);
  const T step_size = T(lr / (1.0 - std::pow(cfg.beta1, double(step))));
  const T bc2_sqrt = T(std::sqrt(1.0 - std::pow(cfg.beta2, double(step))));
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
}

template void adamw_update<float>(float*, float*, float*, const float*, Index, Index,
                                  const AdamWConfig&, double, Index, double);
template void adamw_update<double>(double*, double*, double*, const double*, Index, Index,
                                   const AdamWConfig&, double, Index, double);

}  // namespace cpu

template double grad_sum_of_squares<float>(const float*, Index);
template double grad_sum_of_squares<double>(const double*, Index);
template double global_grad_norm<float>(const float*, Index);
template double global_grad_norm<double>(const double*, Index);

}  // namespace vit
