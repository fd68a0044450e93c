// Model EMA over the contiguous fp32 master buffer (the GPU twin of src/ops/cpu/ema.cpp), and
// the exchange of two buffers (evaluating or saving the EMA with the training model's buffers).
#include "ops/cpu/ema.h"
#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

__global__ void ema_update_kernel(float* ema, const float* params, const double* apply, Index n,
                                  float w) {
  // ema, params (n); apply (1) or nullptr: 0 when the update was skipped (nothing changes)
  if (apply && *apply == 0.0) return;
  const float one_minus_w = 1.0f - w;
  const bool small = fabsf(w) < 0.5f;
  VIT_GRID_STRIDE(i, n) {
    const float start = ema[i], diff = params[i] - start;
    ema[i] = small ? fmaf(w, diff, start) : fmaf(-one_minus_w, diff, params[i]);
  }
}

__global__ void swap_kernel(float* a, float* b, Index n) {
  // a, b (n)
  VIT_GRID_STRIDE(i, n) {
    const float t = a[i];
    a[i] = b[i];
    b[i] = t;
  }
}

}  // namespace

void ema_update(float* ema, const float* params, const double* apply, Index n, double decay) {
  if (n <= 0) return;
  ema_update_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(ema, params, apply, n,
                                                                    float(1.0 - decay));
  VIT_CUDA_LAUNCHED();
}

void swap_buffers(float* a, float* b, Index n) {
  if (n <= 0) return;
  swap_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(a, b, n);
  VIT_CUDA_LAUNCHED();
}

}  // namespace vit::cuda
