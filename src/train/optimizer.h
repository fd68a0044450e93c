// AdamW over the one contiguous parameter buffer (fused: one pass updates params and both
// moments), with decoupled weight decay on elements [0, num_decay) only, exactly as
// torch.optim.AdamW (single-tensor path) computes it, plus global grad-norm clipping.
#pragma once
#include <cstdint>
#include <vector>

#include "core/common.h"

namespace vit {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.05;
  double clip_grad = 0.0;  // max global L2 norm; 0 = no clipping
};

template <typename T>
class AdamW {
 public:
  AdamW(Index n, Index num_decay, AdamWConfig cfg);
  // One update with learning rate `lr`. Returns the global grad norm before clipping.
  double step(T* params, const T* grads, double lr);
  Index num_steps() const { return step_; }

  std::vector<T> m;  // first moment, same layout as params
  std::vector<T> v;  // second moment
  Index step_ = 0;   // updates done (public for checkpoint save/restore)
  AdamWConfig cfg;
  Index num_decay;
};

// sqrt(sum g^2) with fp64 accumulation, parallel.
template <typename T>
double global_grad_norm(const T* grads, Index n);

}  // namespace vit
