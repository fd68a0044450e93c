// Elementwise activations: exact (erf) GELU, h-swish and ReLU (the conv stem), fp32 math on any
// storage type, through the 16-byte packed maps of elementwise.cuh.
#include "ops/cuda/elementwise.cuh"

namespace vit::cuda {

namespace {

// The maps (elementwise.cuh) apply these to fp32 values: one element's formula each.
struct GeluForward {
  __device__ float operator()(float x) const {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  }
};
struct GeluBackward {
  // d/dx [x Phi(x)] = Phi(x) + x phi(x)
  __device__ float operator()(float dout, float x) const {
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
    return dout * (cdf + x * pdf);
  }
};
struct HswishForward {
  // x * relu6(x + 3) / 6
  __device__ float operator()(float x) const {
    return x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f;
  }
};
struct HswishBackward {
  // derivative 0 below -3, (2x + 3) / 6 on [-3, 3], 1 above 3
  __device__ float operator()(float dout, float x) const {
    const float g = x < -3.0f ? 0.0f : (x > 3.0f ? 1.0f : (2.0f * x + 3.0f) / 6.0f);
    return dout * g;
  }
};
struct ReluForward {
  // a NaN passes (not fmaxf, which would drop it)
  __device__ float operator()(float x) const { return x < 0.0f ? 0.0f : x; }
};
struct ReluBackward {
  // inp may be the forward's output
  __device__ float operator()(float dout, float x) const { return x <= 0.0f ? 0.0f : dout; }
};

}  // namespace

// out, inp (n)
template <typename T>
void gelu_forward(T* out, const T* inp, Index n) {
  map1(out, inp, n, GeluForward{});
}

// dinp, dout, inp (n)
template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, Index n) {
  map2(dinp, dout, inp, n, GeluBackward{});
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
  map2_colsum(dinp, dbias, dout, inp, R, C, GeluBackward{});
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

#define INSTANTIATE(T)                                                                 \
  template void gelu_forward<T>(T*, const T*, Index);                                  \
  template void gelu_backward<T>(T*, const T*, const T*, Index);                       \
  template void hswish_forward<T>(T*, const T*, Index);                                \
  template void hswish_backward<T>(T*, const T*, const T*, Index);                     \
  template void gelu_backward_bias<T>(T*, float*, const T*, const T*, Index, Index);   \
  template void hswish_backward_bias<T>(T*, float*, const T*, const T*, Index, Index); \
  template void relu_forward<T>(T*, const T*, Index);                                  \
  template void relu_backward<T>(T*, const T*, const T*, Index);
VIT_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace vit::cuda
