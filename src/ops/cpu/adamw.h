// AdamW over one contiguous buffer (the CPU twin of src/ops/cuda/adamw.cu): one fused pass
// updates params and both moments, decoupled weight decay on elements [0, num_decay) only,
// exactly as torch.optim.AdamW (single-tensor path) computes it; plus the global grad norm.
#pragma once
#include <cmath>

#include "core/common.h"

namespace vit {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.05;
  double clip_grad = 0.0;  // max global L2 norm; 0 = no clipping
};

// An engine's per-update statistics: one fp64 array (kNumStepStats) in the engine's memory (on
// the GPU it stays there between log points). An update whose loss or grad norm is not finite
// is skipped: weights and moments stay as they were, the skip is counted.
enum StepStat : int {
  kLossPending,  // sum of the current update's micro-batch mean losses so far
  kLossLast,     // the last update's loss (finite or not)
  kGradNorm,     // the last update's global grad norm before clipping
  kApply,        // 1 when the last update was applied, 0 when it was skipped
  kLossSum,      // sum of the applied updates' losses since the last read
  kSkipped,      // updates skipped since the last read
  kBadRun,       // consecutive skipped updates up to the last one (0 after an applied one)
  kBadRunMax,    // the longest such run since the last read
  kNumStepStats
};

// Host and device (nvcc compiles this header too): one definition of the bookkeeping.
#ifdef __CUDACC__
#define VIT_HOST_DEVICE __host__ __device__
#else
#define VIT_HOST_DEVICE
#endif

VIT_HOST_DEVICE inline bool is_finite(double x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// Closes an update of `micro_batches` micro-batches: its loss is their mean.
VIT_HOST_DEVICE inline void close_update_loss(double* stats, int micro_batches) {
  stats[kLossLast] = stats[kLossPending] / micro_batches;
  stats[kLossPending] = 0;
}

// With the update's loss and grad norm in stats: decides whether it is applied, counts it.
VIT_HOST_DEVICE inline void judge_update(double* stats) {
  const bool ok = is_finite(stats[kLossLast]) && is_finite(stats[kGradNorm]);
  stats[kApply] = ok ? 1.0 : 0.0;
  if (ok) {
    stats[kLossSum] += stats[kLossLast];
    stats[kBadRun] = 0;
  } else {
    stats[kSkipped] += 1;
    stats[kBadRun] += 1;
    if (stats[kBadRun] > stats[kBadRunMax]) stats[kBadRunMax] = stats[kBadRun];
  }
}

// sum g^2 with fp64 accumulation, parallel (a ZeRO-1 rank sums its block, then the ranks').
template <typename T>
double grad_sum_of_squares(const T* grads, Index n);
// sqrt(sum g^2): the global grad norm of one buffer.
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
