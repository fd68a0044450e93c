// Elementwise activations: exact (erf) GELU, h-swish and ReLU (the conv stem), fp32 math on any
// storage type.
#include "ops/cuda/common.cuh"

namespace vit::cuda {

namespace {

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, Index n) {
  // out, inp (n)
  VIT_GRID_STRIDE(i, n) {
    const float x = to_f32(inp[i]);
    out[i] = from_f32<T>(0.5f * x * (1.0f + erff(x * 0.70710678118654752f)));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* dout, const T* inp, Index n) {
  // dinp, dout, inp (n); d/dx [x Phi(x)] = Phi(x) + x phi(x)
  VIT_GRID_STRIDE(i, n) {
    const float x = to_f32(inp[i]);
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
    dinp[i] = from_f32<T>(to_f32(dout[i]) * (cdf + x * pdf));
  }
}

template <typename T>
__global__ void hswish_forward_kernel(T* out, const T* inp, Index n) {
  // out, inp (n): x * relu6(x + 3) / 6
  VIT_GRID_STRIDE(i, n) {
    const float x = to_f32(inp[i]);
    out[i] = from_f32<T>(x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f);
  }
}

template <typename T>
__global__ void hswish_backward_kernel(T* dinp, const T* dout, const T* inp, Index n) {
  // dinp, dout, inp (n); derivative 0 below -3, (2x + 3) / 6 on [-3, 3], 1 above 3
  VIT_GRID_STRIDE(i, n) {
    const float x = to_f32(inp[i]);
    const float g = x < -3.0f ? 0.0f : (x > 3.0f ? 1.0f : (2.0f * x + 3.0f) / 6.0f);
    dinp[i] = from_f32<T>(to_f32(dout[i]) * g);
  }
}

template <typename T>
__global__ void relu_forward_kernel(T* out, const T* inp, Index n) {
  // out, inp (n), may alias; a NaN passes (not fmaxf, which would drop it)
  VIT_GRID_STRIDE(i, n) {
    const float x = to_f32(inp[i]);
    out[i] = from_f32<T>(x < 0.0f ? 0.0f : x);
  }
}

template <typename T>
__global__ void relu_backward_kernel(T* dinp, const T* dout, const T* inp, Index n) {
  // dinp, dout, inp (n); inp may be the forward's output; dinp may alias dout
  VIT_GRID_STRIDE(i, n) {
    dinp[i] = from_f32<T>(to_f32(inp[i]) <= 0.0f ? 0.0f : to_f32(dout[i]));
  }
}

}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, Index n) {
  if (n <= 0) return;
  gelu_forward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(out, inp, n);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, Index n) {
  if (n <= 0) return;
  gelu_backward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(dinp, dout, inp, n);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void hswish_forward(T* out, const T* inp, Index n) {
  if (n <= 0) return;
  hswish_forward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(out, inp, n);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void hswish_backward(T* dinp, const T* dout, const T* inp, Index n) {
  if (n <= 0) return;
  hswish_backward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(dinp, dout, inp, n);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void relu_forward(T* out, const T* inp, Index n) {
  if (n <= 0) return;
  relu_forward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(out, inp, n);
  VIT_CUDA_LAUNCHED();
}

template <typename T>
void relu_backward(T* dinp, const T* dout, const T* inp, Index n) {
  if (n <= 0) return;
  relu_backward_kernel<<<grid_stride_blocks(n), kBlock, 0, stream()>>>(dinp, dout, inp, n);
  VIT_CUDA_LAUNCHED();
}

#define INSTANTIATE(T)                                             \
  template void gelu_forward<T>(T*, const T*, Index);              \
  template void gelu_backward<T>(T*, const T*, const T*, Index);   \
  template void hswish_forward<T>(T*, const T*, Index);            \
  template void hswish_backward<T>(T*, const T*, const T*, Index); \
  template void relu_forward<T>(T*, const T*, Index);              \
  template void relu_backward<T>(T*, const T*, const T*, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
