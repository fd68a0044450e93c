// Elementwise activations: exact (erf) GELU, tanh-approximation GELU, h-swish and ReLU (the conv
// stem), fp32 math on any storage type, through the 16-byte packed maps of elementwise.cuh.
#include "ops/cuda/activation_math.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/kernel_plan.h"

namespace vit::cuda {

namespace {

// The exact GELU through one exponential (gelu_cdf_fast) where the kernel plan says gelu=fast
// (--kernels; other last bits than erff's), else through erff.
template <typename T>
bool gelu_fast(Index n) {
  return planned_choice(gelu_key(n, storage_of<T>())).variant == "fast";
}

}  // namespace

// out, inp (n)
template <typename T>
void gelu_forward(T* out, const T* inp, Index n) {
  if (gelu_fast<T>(n))
    map1(out, inp, n, GeluForwardFast{});
  else
    map1(out, inp, n, GeluForward{});
}

// dinp, dout, inp (n)
template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, Index n) {
  if (gelu_fast<T>(n))
    map2(dinp, dout, inp, n, GeluBackwardFast{});
  else
    map2(dinp, dout, inp, n, GeluBackward{});
}

// out, inp (n)
template <typename T>
void gelu_tanh_forward(T* out, const T* inp, Index n) {
  map1(out, inp, n, GeluTanhForward{});
}

// dinp, dout, inp (n)
template <typename T>
void gelu_tanh_backward(T* dinp, const T* dout, const T* inp, Index n) {
  map2(dinp, dout, inp, n, GeluTanhBackward{});
}

// out, inp (n)
template <typename T>
void hswish_forward(T* out, const T* inp, Index n) {
  map1(out, inp, n, HswishForward{});
}

// dinp, dout, inp (n)
template <typename T>
void hswish_backward(T* dinp, const T* dout, const T* inp, Index n) {
  map2(dinp, dout, inp, n, HswishBackward{});
}

// dinp, dout, inp (R, C); dbias (C) accumulates the column sums of dinp
template <typename T>
void gelu_backward_bias(T* dinp, float* dbias, const T* dout, const T* inp, Index R, Index C) {
  if (gelu_fast<T>(R * C))
    map2_colsum(dinp, dbias, dout, inp, R, C, GeluBackwardFast{});
  else
    map2_colsum(dinp, dbias, dout, inp, R, C, GeluBackward{});
}

// dinp, dout, inp (R, C); dbias (C) accumulates the column sums of dinp
template <typename T>
void gelu_tanh_backward_bias(T* dinp, float* dbias, const T* dout, const T* inp, Index R, Index C) {
  map2_colsum(dinp, dbias, dout, inp, R, C, GeluTanhBackward{});
}

// dinp, dout, inp (R, C); dbias (C) accumulates the column sums of dinp
template <typename T>
void hswish_backward_bias(T* dinp, float* dbias, const T* dout, const T* inp, Index R, Index C) {
  map2_colsum(dinp, dbias, dout, inp, R, C, HswishBackward{});
}

// out, inp (n), may alias
template <typename T>
void relu_forward(T* out, const T* inp, Index n) {
  map1(out, inp, n, ReluForward{});
}

// dinp, dout, inp (n); dinp may alias dout
template <typename T>
void relu_backward(T* dinp, const T* dout, const T* inp, Index n) {
  map2(dinp, dout, inp, n, ReluBackward{});
}

#define INSTANTIATE(T)                                                                    \
  template void gelu_forward<T>(T*, const T*, Index);                                     \
  template void gelu_backward<T>(T*, const T*, const T*, Index);                          \
  template void gelu_tanh_forward<T>(T*, const T*, Index);                                \
  template void gelu_tanh_backward<T>(T*, const T*, const T*, Index);                     \
  template void hswish_forward<T>(T*, const T*, Index);                                   \
  template void hswish_backward<T>(T*, const T*, const T*, Index);                        \
  template void gelu_backward_bias<T>(T*, float*, const T*, const T*, Index, Index);      \
  template void gelu_tanh_backward_bias<T>(T*, float*, const T*, const T*, Index, Index); \
  template void hswish_backward_bias<T>(T*, float*, const T*, const T*, Index, Index);    \
  template void relu_forward<T>(T*, const T*, Index);                                     \
  template void relu_backward<T>(T*, const T*, const T*, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
