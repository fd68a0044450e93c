// timm's RandomErasing (mode 'pixel', one box) as plain data: the box a sample's RNG drew and a
// key for its noise. The noise is N(0, 1)-shaped values made from (key, index in the box) by
// integer hashing and one interpolated lookup in a table of normal quantiles, with exactly
// rounded float operations only, so the CPU pipeline (data/augment.h: random_erasing), the
// reference input ops and the GPU make the same floats. Shared by the data layer and the ops.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/host_device.h"
#include "core/rng.h"

namespace vit {

struct ErasePlan {
  int32_t top = 0, left = 0, h = 0, w = 0;  // the box; h == 0: nothing erased
  uint64_t key = 0;                         // the noise's key (one draw of the sample's RNG)

  VIT_HOST_DEVICE bool covers(int64_t y, int64_t x) const {
    return y >= top && y < top + h && x >= left && x < left + w;
  }
};

constexpr int kEraseNoiseBits = 12;                           // 2^12 intervals of the table
constexpr int kEraseNoiseTable = (1 << kEraseNoiseBits) + 1;  // quantiles, kEraseNoiseTable floats

// The noise of value i (c, y, x of the box, row-major) under key: splitmix64 of (key, i); its
// top 12 bits pick the interval of the table, the next 24 the position in it.
VIT_HOST_DEVICE inline float erase_noise(const float* table, uint64_t key, uint64_t i) {
  const uint64_t z = mix64(key ^ (i * kGoldenGamma));
  const uint32_t at = uint32_t(z >> (64 - kEraseNoiseBits));
  const float frac = float(uint32_t(z >> (40 - kEraseNoiseBits)) & 0xffffffu) * 0x1.0p-24f;
  const float lo = table[at], hi = table[at + 1];
#if defined(__CUDA_ARCH__)  // one rounding of the product-sum on every backend
  return __fmaf_rn(frac, hi - lo, lo);
#else
  return std::fma(frac, hi - lo, lo);
#endif
}

// The table: the standard normal's quantiles at (j + 0.5) / kEraseNoiseTable, j < 4097. With the
// linear interpolation the values lie within +-3.67 and have standard deviation 0.9983 (1 for
// timm's torch.normal_; exact for this construction, and tests/test_augment.cpp measures it).
// Computed once on the host.
inline const std::vector<float>& erase_noise_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(kEraseNoiseTable, 0.0f);  // the middle entry is 0
    for (int j = 0; j < kEraseNoiseTable / 2; ++j) {
      const double p = (j + 0.5) / kEraseNoiseTable;
      double lo = -10, hi = 0;  // bisection of Phi(x) = p, Phi(x) = erfc(-x / sqrt 2) / 2
      for (int it = 0; it < 80; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
      }
      t[size_t(j)] = float(0.5 * (lo + hi));
      t[size_t(kEraseNoiseTable - 1 - j)] = -t[size_t(j)];  // symmetric: mean 0 exactly
    }
    return t;
  }();
  return table;
}

}  // namespace vit
