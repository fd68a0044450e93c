// Elementwise activations: exact (erf) GELU, tanh-approximation GELU, h-swish and ReLU (the conv
// stem).
#include <algorithm>
#include <cmath>

#include "ops/cpu/blas.h"
#include "ops/cpu/fast_math.h"
#include "ops/cpu/ops.h"

namespace vit::cpu {

template <typename T>
void gelu_forward(T* out, const T* inp, Index n) {
  const T inv_sqrt2 = T(0.70710678118654752440);
#pragma omp parallel for simd schedule(static)
  for (Index i = 0; i < n; ++i) out[i] = T(0.5) * inp[i] * (T(1) + erf_any(inp[i] * inv_sqrt2));
}

template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, Index n) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  const T inv_sqrt2pi = T(0.39894228040143267794);
  // d/dx [x Phi(x)] = Phi(x) + x phi(x)
#pragma omp parallel for simd schedule(static)
  for (Index i = 0; i < n; ++i) {
    const T x = inp[i];
    const T cdf = T(0.5) * (T(1) + erf_any(x * inv_sqrt2));
    const T pdf = inv_sqrt2pi * exp_any(T(-0.5) * x * x);
    dinp[i] = dout[i] * (cdf + x * pdf);
  }
}

template <typename T>
void gelu_tanh_forward(T* out, const T* inp, Index n) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch's gelu(approximate='tanh')
  const T sqrt_2_over_pi = T(0.79788456080286535588);
  const T k = T(0.044715);
#pragma omp parallel for simd schedule(static)
  for (Index i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + tanh_any(sqrt_2_over_pi * (x + k * x * x * x)));
  }
}

template <typename T>
void gelu_tanh_backward(T* dinp, const T* dout, const T* inp, Index n) {
  const T sqrt_2_over_pi = T(0.79788456080286535588);
  const T k = T(0.044715);
  // with u = sqrt(2/pi) (x + k x^3), t = tanh(u):
  // d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 k x^2)
#pragma omp parallel for simd schedule(static)
  for (Index i = 0; i < n; ++i) {
    const T x = inp[i];
    const T t = tanh_any(sqrt_2_over_pi * (x + k * x * x * x));
    const T du = sqrt_2_over_pi * (T(1) + T(3) * k * x * x);
    dinp[i] = dout[i] * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
  }
}

template <typename T>
void hswish_forward(T* out, const T* inp, Index n) {
#pragma omp parallel for simd schedule(static)
  for (Index i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = x * std::min(std::max(x + T(3), T(0)), T(6)) / T(6);
  }
}

template <typename T>
void hswish_backward(T* dinp, const T* dout, const T* inp, Index n) {
  // derivative: 0 for x < -3, (2x + 3) / 6 on [-3, 3], 1 for x > 3
#pragma omp parallel for simd schedule(static)
  for (Index i = 0; i < n; ++i) {
    const T x = inp[i];
    const T g = x < T(-3) ? T(0) : (x > T(3) ? T(1) : (T(2) * x + T(3)) / T(6));
    dinp[i] = dout[i] * g;
  }
}

// Both written so that a NaN passes through, as PyTorch's ReLU (the non-finite guard sees it).
template <typename T>
void relu_forward(T* out, const T* inp, Index n) {
#pragma omp parallel for simd schedule(static)
  for (Index i = 0; i < n; ++i) out[i] = inp[i] < T(0) ? T(0) : inp[i];
}

template <typename T>
void relu_backward(T* dinp, const T* dout, const T* inp, Index n) {
#pragma omp parallel for simd schedule(static)
  for (Index i = 0; i < n; ++i) dinp[i] = inp[i] <= T(0) ? T(0) : dout[i];
}

#define INSTANTIATE(T)                                                \
  template void gelu_forward<T>(T*, const T*, Index);                 \
  template void gelu_backward<T>(T*, const T*, const T*, Index);      \
  template void gelu_tanh_forward<T>(T*, const T*, Index);            \
  template void gelu_tanh_backward<T>(T*, const T*, const T*, Index); \
  template void hswish_forward<T>(T*, const T*, Index);               \
  template void hswish_backward<T>(T*, const T*, const T*, Index);    \
  template void relu_forward<T>(T*, const T*, Index);                 \
  template void relu_backward<T>(T*, const T*, const T*, Index);
VIT_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace vit::cpu
