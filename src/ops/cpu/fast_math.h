// Branch-free float exp, erf and tanh that GCC vectorises (libm's scalar calls would dominate the
// elementwise ops). Accuracy: exp ~1 ulp on [-87, 88]; erf absolute error < 2e-7; tanh absolute
// error ~1e-7. The double
// instantiations of the ops use libm, so finite-difference checks run against exact functions.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace vit::cpu {

[[gnu::always_inline]] inline float exp_fast(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  // x = n ln2 + r, |r| <= ln2 / 2; ln2 split in a hi part exact in float and a lo correction.
  // Round to nearest by the 1.5 * 2^23 trick (nearbyint blocks vectorisation).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  // Taylor series of e^r to degree 7: truncation error < 5e-9 relative on |r| <= 0.347.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  return p * std::bit_cast<float>(bits);
}

// erf via the Chebyshev-fitted erfc(z) = t exp(-z^2 + poly(t)), t = 1 / (1 + z/2), z = |x|,
// whose fractional error is below 1.2e-7 everywhere.
[[gnu::always_inline]] inline float erf_fast(float x) {
  const float z = x < 0.0f ? -x : x;
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float erfc = t * exp_fast(-z * z + p);
  return x < 0.0f ? erfc - 1.0f : 1.0f - erfc;
}

// tanh(x) = sign(x) (1 - 2 / (exp(2|x|) + 1)); saturates to +-1 (exp_fast clamps, no inf). Near
// 0 the error is absolute (~1e-7), not relative: the GELU adds t to 1 or multiplies it by x.
[[gnu::always_inline]] inline float tanh_fast(float x) {
  const float z = x < 0.0f ? -x : x;
  const float t = 1.0f - 2.0f / (exp_fast(2.0f * z) + 1.0f);
  return x < 0.0f ? -t : t;
}

inline float exp_any(float x) {
  return exp_fast(x);
}
inline double exp_any(double x) {
  return std::exp(x);
}
inline float erf_any(float x) {
  return erf_fast(x);
}
inline double erf_any(double x) {
  return std::erf(x);
}
inline float tanh_any(float x) {
  return tanh_fast(x);
}
inline double tanh_any(double x) {
  return std::tanh(x);
}

}  // namespace vit::cpu
