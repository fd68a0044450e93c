#include "train/optimizer.h"

namespace vit {

template <typename T>
AdamW<T>::AdamW(Index n, Index num_decay_, AdamWConfig cfg_)
    : m(n, T(0)), v(n, T(0)), cfg(cfg_), num_decay(num_decay_) {}

template <typename T>
double AdamW<T>::step(T* params, const T* grads, double lr) {
  const Index n = Index(m.size());
  const double norm = global_grad_norm(grads, n);
  ++step_;
  cpu::adamw_update(params, m.data(), v.data(), grads, n, num_decay, cfg, lr, step_,
                    clip_scale(cfg, norm));
  return norm;
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace vit
