// Softmax cross-entropy on soft targets, fp32 throughout (log-sum-exp with the row max, so
// logits near +-80 neither overflow nor lose the loss).
#include <cmath>

#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per sample

template <typename T>
__global__ void cross_entropy_forward_kernel(float* losses, float* probs, const T* logits,
                                             const float* targets, Index B, Index K) {
  // logits, targets, probs (B, K); losses (B)
  const Index b = blockIdx.x * Index(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (b >= B) return;
  const T* z = logits + b * K;
  const float* t = targets + b * K;
  float* p = probs + b * K;
  float mx = -INFINITY;
  for (Index k = lane; k < K; k += 32) mx = fmaxf(mx, to_f32(z[k]));
  mx = warp_max(mx);
  float sum = 0.0f;
  for (Index k = lane; k < K; k += 32) sum += expf(to_f32(z[k]) - mx);
  const float lse = logf(warp_sum(sum));  // log sum exp(z - mx)
  float loss = 0.0f;
  for (Index k = lane; k < K; k += 32) {
    const float logp = to_f32(z[k]) - mx - lse;
    p[k] = expf(logp);
    loss -= t[k] * logp;
  }
  loss = warp_sum(loss);
  if (lane == 0) losses[b] = loss;
}

template <typename T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const float* probs, const float* targets,
                                              float dloss, Index n) {
  // dlogits, probs, targets (B, K) flattened to n; targets sum to 1 per row (see the CPU op)
  VIT_GRID_STRIDE(i, n) dlogits[i] = from_f32<T>((probs[i] - targets[i]) * dloss);
}

}  // namespace

template <typename T>
void cross_entropy_forward(float* losses, float* probs, const T* logits, const float* targets,
                           Index B, Index K) {
  if (B <= 0) return;
  cross_entropy_forward_kernel<<<blocks_for(B, kRowsPerBlock), kRowsPerBlock * 32, 0, stream()>>>(
      losses, probs, logits, targets, B, K);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void cross_entropy_backward(T* dlogits, const float* probs, const float* targets, float dloss,
                            Index B, Index K) {
  if (B * K <= 0) return;
  cross_entropy_backward_kernel<<<grid_stride_blocks(B * K), kBlock, 0, stream()>>>(
      dlogits, probs, targets, dloss, B * K);
  VIT_CUDA_LAUNCHED();
}

#define INSTANTIATE(T)                                                                          \
  template void cross_entropy_forward<T>(float*, float*, const T*, const float*, Index, Index); \
  template void cross_entropy_backward<T>(T*, const float*, const float*, float, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
