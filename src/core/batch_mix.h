// timm's Mixup / CutMix in 'batch' mode: sample b is mixed with its partner B-1-b (x.flip(0)).
// One draw per batch, as plain data shared by the data layer, which draws it
// (data/augment.h: draw_mixup), and the input ops, which apply it where the images are made
// (src/ops/*/resize_batch: the planned batches of --augment-on-device).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/common.h"
#include "core/host_device.h"

namespace vit {

struct BatchMix {
  float lam = 1.0f;    // the sample's own weight (mixup); 1 without cutmix = no mixing
  int32_t cutmix = 0;  // 1: the box is the partner's pixels, the rest the sample's own
  int32_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;  // cutmix box: rows [y0, y1), cols [x0, x1)

  VIT_HOST_DEVICE bool none() const { return cutmix == 0 && lam == 1.0f; }
  VIT_HOST_DEVICE bool in_box(Index y, Index x) const {
    return y >= y0 && y < y1 && x >= x0 && x < x1;
  }
};

// One blended value: own * lam + partner * (1 - lam) as one fused multiply-add, spelled out so
// that every backend rounds alike (no other contraction on the GPU).
VIT_HOST_DEVICE inline float mix_value(float own, float partner, float lam) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(own, lam, __fmul_rn(partner, __fsub_rn(1.0f, lam)));
#else
  return std::fma(own, lam, partner * (1.0f - lam));
#endif
}

}  // namespace vit
