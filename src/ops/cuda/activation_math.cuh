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
// The exact GELU with one exponential instead of erff's two branches (--kernels gelu=fast in
// activations.cu; off by default until a GPU run shows what it pays and that the model tests
// hold). erff's small- and large-argument formulas are both evaluated and one selected in the
// packed loops, so the exact GELU's passes are arithmetic-bound (~40 and ~60 PTX instructions
// an element, forward and backward). Here, with z = |x| / sqrt(2) and t = 1 / (1 + z / 2),
// erfc(z) = t exp(-z^2 + P(t)), P of degree 9 fitted for this code (relative error of erfc under
// 4.3e-8 in fp64 for z in [0, 9.5], beyond which fp32 underflows), evaluated in log2 units with
// the 1/2 of Phi folded in: Phi(x) = 1 - e for x >= 0, e for x < 0, e = t 2^(P2(t) - x^2 log2(e)
// / 2). The fp32 result is within 9e-7 relative of the exact GELU for |x| < 3 (where nearly all
// activations are; 1.4e-6 to 5, 7.5e-6 at -12, on values under 1e-30), against erff's ~2 ulps.
constexpr float kHalfLog2e = 0.72134752044448170f;  // log2(e) / 2
__device__ __forceinline__ float gelu_cdf_fast(float x) {
  const float z = fabsf(x) * 0.70710678118654752f;
  const float t = __fdividef(1.0f, fmaf(0.5f, z, 1.0f));
  float p = 0.19923549890518188f;
  p = fmaf(p, t, -0.92839854955673218f);
  p = fmaf(p, t, 1.5418061017990112f);
  p = fmaf(p, t, -0.83505332469940186f);
  p = fmaf(p, t, -0.25619518756866455f);
  p = fmaf(p, t, 0.076490253210067749f);
  p = fmaf(p, t, 0.024518243968486786f);
  p = fmaf(p, t, 0.56311762332916260f);
  p = fmaf(p, t, 1.4401044845581055f);
  p = fmaf(p, t, -2.8256251811981201f);
  const float e = t * exp2f(fmaf(-x, x * kHalfLog2e, p));
  return x >= 0.0f ? 1.0f - e : e;
}
struct GeluForwardFast {
  __device__ float operator()(float x) const { return x * gelu_cdf_fast(x); }
};
struct GeluBackwardFast {
  // Phi(x) + x phi(x), phi(x) = 2^(-x^2 log2(e) / 2 - log2(sqrt(2 pi)))
  __device__ float operator()(float dout, float x) const {
    const float pdf = exp2f(fmaf(-x, x * kHalfLog2e, -1.3257480647361594f));
    return dout * fmaf(x, pdf, gelu_cdf_fast(x));
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
