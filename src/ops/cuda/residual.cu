// Residual add of a block branch with optional layer scale (gamma) and stochastic depth (a
// per-sample scale of 0 or 1/keep_prob); the layer-scale gradient is a deterministic column sum.
#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

template <typename T>
__global__ void residual_forward_kernel(T* out, const T* x, const T* branch, const T* gamma,
                                        const float* sample_scale, Index B, Index S, Index C) {
  // out, x, branch (B, S, C); gamma (C); sample_scale (B). out may alias x: each element is
  // read and written by the same thread only.
  VIT_GRID_STRIDE(i, B * S * C) {
    const Index c = i % C, b = i / (S * C);
    const float k = sample_scale ? sample_scale[b] : 1.0f;
    const float g = gamma ? to_f32(gamma[c]) : 1.0f;
    out[i] = from_f32<T>(to_f32(x[i]) + k * g * to_f32(branch[i]));
  }
}

template <typename T>
__global__ void residual_dbranch_kernel(T* dbranch, const T* dout, const T* gamma,
                                        const float* sample_scale, Index B, Index S, Index C) {
  // dbranch, dout (B, S, C) = sample_scale[b] * gamma[c] * dout
  VIT_GRID_STRIDE(i, B * S * C) {
    const Index c = i % C, b = i / (S * C);
    const float k = sample_scale ? sample_scale[b] : 1.0f;
    const float g = gamma ? to_f32(gamma[c]) : 1.0f;
    dbranch[i] = from_f32<T>(k * g * to_f32(dout[i]));
  }
}

template <typename T>
struct GammaGrad {  // f(r, c) = sample_scale[b] * branch * dout at row r = b * S + s
  const T* branch;
  const T* dout;
  const float* sample_scale;
  Index S, C;
  __device__ float operator()(Index r, Index c) const {
    const float k = sample_scale ? sample_scale[r / S] : 1.0f;
    return k * to_f32(branch[r * C + c]) * to_f32(dout[r * C + c]);
  }
};

}  // namespace

template <typename T>
void residual_forward(T* out, const T* x, const T* branch, const T* gamma,
                      const float* sample_scale, Index B, Index S, Index C) {
  if (B * S * C <= 0) return;
  residual_forward_kernel<<<grid_stride_blocks(B * S * C), kBlock, 0, stream()>>>(
      out, x, branch, gamma, sample_scale, B, S, C);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void residual_backward(T* dbranch, float* dgamma, const T* dout, const T* branch, const T* gamma,
                       const float* sample_scale, Index B, Index S, Index C) {
  if (B * S * C <= 0) return;
  if (dbranch) {
    residual_dbranch_kernel<<<grid_stride_blocks(B * S * C), kBlock, 0, stream()>>>(
        dbranch, dout, gamma, sample_scale, B, S, C);
    VIT_CUDA_LAUNCHED();
  }
  if (dgamma) colsum_accumulate(dgamma, GammaGrad<T>{branch, dout, sample_scale, S, C}, B * S, C);
}

#define INSTANTIATE(T)                                                                            \
  template void residual_forward<T>(T*, const T*, const T*, const T*, const float*, Index, Index, \
                                    Index);                                                       \
  template void residual_backward<T>(T*, float*, const T*, const T*, const T*, const float*,      \
                                     Index, Index, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
