// The activations' formulas on fp32 values, one element each: the elementwise maps of
// activations.cu and the fused locality-FFN kernels of dwconv.cu apply the same functors, so
// both give the same bits.
#pragma once

namespace vit::cuda {

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
struct GeluTanhForward {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch's gelu(approximate='tanh')
  __device__ float operator()(float x) const {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  }
};
struct GeluTanhBackward {
  // with t = tanh(u), u = sqrt(2/pi) (x + 0.044715 x^3):
  // d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
  __device__ float operator()(float dout, float x) const {
    const float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));
    const float du = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);
    return dout * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
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

}  // namespace vit::cuda
