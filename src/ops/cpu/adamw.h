// AdamW over one contiguous buffer (the CPU twin of src/ops/cuda/adamw.cu): one fused pass
// updates params and both moments, decoupled weight decay on elements [0, num_decay) only,
// exactly as torch.optim.AdamW (single-tensor path) computes it; plus the global grad norm.
#pragma once
#include "core/common.h"

namespace vit {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.05;
  double clip_grad = 0.0;  // max global L2 norm; 0 = no clipping
};

// sqrt(sum g^2) with fp64 accumulation, parallel.
template <typename T>
double global_grad_norm(const T* grads, Index n);

// torch.nn.utils.clip_grad_norm_'s factor for a gradient of norm `norm` (1 without clipping).
double clip_scale(const AdamWConfig& cfg, double norm);

namespace cpu {
// One update of params, m, v (n) from grads * grad_scale; `step` is the update's 1-based
// number (bias correction).
template <typename T>
void adamw_update(T* params, T* m, T* v, const T* grads, Index n, Index num_decay,
                  const AdamWConfig& cfg, double lr, Index step, double grad_scale);
}  // namespace cpu

}  // namespace vit
