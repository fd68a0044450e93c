// LayerNorm over channels, one warp per row, fp32 statistics. The row is shifted by its first
// value before the two-pass mean/variance, so rows with a large mean and a tiny spread
// (mean 1e3, std 1e-2) keep fp32 accuracy without the CPU's fp64 sums.
#include <algorithm>

#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // forward: warps per block
constexpr int kBwdWarps = 4;      // backward: warps per block

// Mean of (x - x0) over the row, x0 = x[0]; every lane of the warp gets it.
template <typename T>
__device__ __forceinline__ float shifted_mean(const T* x, float x0, Index C, int lane) {
  float s = 0.0f;
  for (Index c = lane; c < C; c += 32) s += to_f32(x[c]) - x0;
  return warp_sum(s) / float(C);
}

template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp,
                                         const T* weight, const T* bias, Index R, Index C,
                                         float eps) {
  // inp, out (R, C); weight, bias (C); mean, rstd (R)
  const Index r = blockIdx.x * Index(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= R) return;  // whole warps leave together
  const T* x = inp + r * C;
  T* y = out + r * C;
  const float x0 = to_f32(x[0]);
  const float md = shifted_mean(x, x0, C, lane);
  float sq = 0.0f;
  for (Index c = lane; c < C; c += 32) {
    const float d = to_f32(x[c]) - x0 - md;
    sq += d * d;
  }
  sq = warp_sum(sq);
  const float rs = 1.0f / sqrtf(sq / float(C) + eps);
  for (Index c = lane; c < C; c += 32) {
    const float xh = (to_f32(x[c]) - x0 - md) * rs;
    y[c] = from_f32<T>(xh * to_f32(weight[c]) + to_f32(bias[c]));
  }
  if (lane == 0) {
    mean[r] = x0 + md;
    rstd[r] = rs;
  }
}

template <typename T>
__global__ void layernorm_backward_kernel(T* dinp, float* partial, const T* dout, const T* inp,
                                          const T* weight, const float* rstd, Index R, Index C) {
  // dinp, dout, inp (R, C); weight (C); rstd (R); partial (gridDim.x, 2, C) dweight/dbias sums
  extern __shared__ float sm[];  // (kBwdWarps, 2, C) per-warp column partials
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (Index i = threadIdx.x; i < Index(kBwdWarps) * 2 * C; i += blockDim.x) sm[i] = 0.0f;
  __syncthreads();
  float* dw_w = sm + Index(warp) * 2 * C;  // (C)
  float* db_w = dw_w + C;                  // (C)
  for (Index r = blockIdx.x * Index(kBwdWarps) + warp; r < R; r += Index(gridDim.x) * kBwdWarps) {
    const T* x = inp + r * C;
    const T* dy = dout + r * C;
    // The shifted mean again (the saved fp32 mean is rounded; see the file comment).
    const float x0 = to_f32(x[0]);
    const float md = shifted_mean(x, x0, C, lane);
    const float rs = rstd[r];
    // dnorm = dy * w; dx = rs * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
    float sum_dn = 0.0f, sum_dn_xh = 0.0f;
    for (Index c = lane; c < C; c += 32) {
      const float xh = (to_f32(x[c]) - x0 - md) * rs;
      const float g = to_f32(dy[c]);
      const float dn = g * to_f32(weight[c]);
      sum_dn += dn;
      sum_dn_xh += dn * xh;
      dw_w[c] += g * xh;
      db_w[c] += g;
    }
    const float m_dn = warp_sum(sum_dn) / float(C);
    const float m_dn_xh = warp_sum(sum_dn_xh) / float(C);
    if (dinp) {
      T* dx = dinp + r * C;
      for (Index c = lane; c < C; c += 32) {
        const float xh = (to_f32(x[c]) - x0 - md) * rs;
        const float dn = to_f32(dy[c]) * to_f32(weight[c]);
        dx[c] = from_f32<T>(to_f32(dx[c]) + rs * (dn - m_dn - xh * m_dn_xh));
      }
    }
  }
  __syncthreads();
  // Sum the warps' partials in warp order (deterministic) into this block's slot.
  float* out = partial + Index(blockIdx.x) * 2 * C;
  for (Index i = threadIdx.x; i < 2 * C; i += blockDim.x) {
    float s = 0.0f;
    for (int w = 0; w < kBwdWarps; ++w) s += sm[Index(w) * 2 * C + i];
    out[i] = s;
  }
}

__global__ void layernorm_param_grad_kernel(float* dweight, float* dbias, const float* partial,
                                            Index blocks, Index C) {
  // partial (blocks, 2, C) -> dweight, dbias (C) accumulate
  const Index c = blockIdx.x * Index(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float sw = 0.0f, sb = 0.0f;
  for (Index k = 0; k < blocks; ++k) {
    sw += partial[k * 2 * C + c];
    sb += partial[k * 2 * C + C + c];
  }
  if (dweight) dweight[c] += sw;
  if (dbias) dbias[c] += sb;
}

}  // namespace

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, Index R, Index C, float eps) {
  if (R <= 0) return;
  layernorm_forward_kernel<<<blocks_for(R, kRowsPerBlock), kRowsPerBlock * 32, 0, stream()>>>(
      out, mean, rstd, inp, weight, bias, R, C, eps);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                        const T* weight, const float* mean, const float* rstd, Index R, Index C) {
  if (R <= 0) return;
  const Index blocks = std::min<Index>((R + kBwdWarps - 1) / kBwdWarps, Index(num_sms()) * 4);
  const size_t smem = size_t(kBwdWarps) * 2 * size_t(C) * sizeof(float);
  if (smem > 48 * 1024)
    VIT_CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<T>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  auto* partial = static_cast<float*>(
      scratch(size_t(blocks) * 2 * size_t(C) * sizeof(float), kScratchLayernorm));
  layernorm_backward_kernel<<<unsigned(blocks), kBwdWarps * 32, smem, stream()>>>(
      dinp, partial, dout, inp, weight, rstd, R, C);
  VIT_CUDA_LAUNCHED();
  if (dweight || dbias) {
    layernorm_param_grad_kernel<<<blocks_for(C), kBlock, 0, stream()>>>(dweight, dbias, partial,
                                                                        blocks, C);
    VIT_CUDA_LAUNCHED();
  }
}

#define INSTANTIATE(T)                                                                        \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, Index, \
                                     Index, float);                                           \
  template void layernorm_backward<T>(T*, float*, float*, const T*, const T*, const T*,       \
                                      const float*, const float*, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
