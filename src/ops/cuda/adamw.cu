// Fused AdamW over the contiguous fp32 master buffer (the twin of src/train/optimizer.cpp) and
// the global grad norm for clipping. The clip scale is computed on the device from the norm the
// reduction left there, so an optimizer step needs no host round trip.
#include <algorithm>
#include <cmath>

#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

// Fixed, device-independent block count: the partial sums and their order, hence the bits of
// the norm, are the same on every GPU.
constexpr int kNormBlocks = 512;

__global__ void grad_norm_partial_kernel(double* partial, const float* grads, Index n) {
  // grads (n) -> partial (gridDim.x) sums of squares, fp64 as on the CPU
  __shared__ double sm[32];
  double s = 0.0;
  VIT_GRID_STRIDE(i, n) {
    const double g = grads[i];
    s += g * g;
  }
  s = block_sum(s, sm);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void grad_norm_finish_kernel(double* norm, const double* partial, int count,
                                        bool take_sqrt) {
  // partial (count) -> norm (1), or the sum of squares when !take_sqrt
  __shared__ double sm[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, sm);
  if (threadIdx.x == 0) *norm = take_sqrt ? sqrt(s) : s;
}

__global__ void sqrt_kernel(double* x) {
  // x (1)
  *x = sqrt(*x);
}

void grad_norm_reduce(double* out, const float* grads, Index n, bool take_sqrt) {
  if (n <= 0) {
    VIT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream()));
    return;
  }
  const unsigned blocks = std::min(blocks_for(n), unsigned(kNormBlocks));
  auto* partial = static_cast<double*>(scratch(kNormBlocks * sizeof(double), kScratchNorm));
  grad_norm_partial_kernel<<<blocks, kBlock, 0, stream()>>>(partial, grads, n);
  VIT_CUDA_LAUNCHED();
  grad_norm_finish_kernel<<<1, 1024, 0, stream()>>>(out, partial, int(blocks), take_sqrt);
  VIT_CUDA_LAUNCHED();
}

__global__ void judge_update_kernel(double* stats) {
  // stats (kNumStepStats) fp64
  ::vit::judge_update(stats);
}

template <typename TLow>
__global__ void adamw_kernel(float* params, TLow* params_lowp, float* m, float* v,
                             const float* grads, const double* grad_norm, const double* apply,
                             Index n, Index num_decay, float b1, float b2, float eps, float decay,
                             float step_size, float bc2_sqrt, double clip) {
  // params, params_lowp, m, v, grads (n); grad_norm (1), read only when clipping; apply (1)
  // or nullptr: a skipped update (0) leaves everything as it was.
  if (apply && *apply == 0.0) return;
  // torch.nn.utils.clip_grad_norm_: scale by clip / (norm + 1e-6) when that is below 1.
  float gs = 1.0f;
  if (clip > 0.0) gs = float(fmin(1.0, clip / (*grad_norm + 1e-6)));
  VIT_GRID_STRIDE(i, n) {
    // torch.optim.AdamW (single-tensor): decay, moments, bias-corrected step; the same
    // operations in the same order as vit::AdamW<float>::step.
    const float g = grads[i] * gs;
    float p = params[i];
    if (i < num_decay) p *= decay;
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p = p - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    params[i] = p;
    if (params_lowp) params_lowp[i] = from_f32<TLow>(p);
  }
}

}  // namespace

void global_grad_norm(double* norm, const float* grads, Index n) {
  grad_norm_reduce(norm, grads, n, true);
}

void grad_sum_of_squares(double* sumsq, const float* grads, Index n) {
  grad_norm_reduce(sumsq, grads, n, false);
}

void sqrt_in_place(double* x) {
  sqrt_kernel<<<1, 1, 0, stream()>>>(x);
  VIT_CUDA_LAUNCHED();
}

void judge_update(double* stats) {
  judge_update_kernel<<<1, 1, 0, stream()>>>(stats);
  VIT_CUDA_LAUNCHED();
}

template <typename TLow>
void adamw_step(float* params, TLow* params_lowp, float* m, float* v, const float* grads,
                const double* grad_norm, const double* apply, Index n, Index num_decay,
                const AdamWConfig& cfg, double lr, Index step) {
  VIT_CHECK(step >= 1, "adamw_step: step counts from 1");
  VIT_CHECK(cfg.clip_grad <= 0 || grad_norm, "adamw_step: clipping needs the grad norm");
  if (n <= 0) return;
  // Host-side constants exactly as the CPU optimizer computes them (fp64, then rounded).
  const float decay = float(1.0 - lr * cfg.weight_decay);
  const float step_size = float(lr / (1.0 - std::pow(cfg.beta1, double(step))));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(cfg.beta2, double(step))));
  adamw_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(
      params, params_lowp, m, v, grads, grad_norm, apply, n, num_decay, float(cfg.beta1),
      float(cfg.beta2), float(cfg.eps), decay, step_size, bc2_sqrt, cfg.clip_grad);
  VIT_CUDA_LAUNCHED();
}

template void adamw_step<float>(float*, float*, float*, float*, const float*, const double*,
                                const double*, Index, Index, const AdamWConfig&, double, Index);
template void adamw_step<bf16>(float*, bf16*, float*, float*, const float*, const double*,
                               const double*, Index, Index, const AdamWConfig&, double, Index);

}  // namespace vit::cuda
