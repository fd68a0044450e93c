// Model EMA over the contiguous parameter buffer (the CPU twin of src/ops/cuda/ema.cu):
// ema = lerp(ema, params, 1 - decay) with PyTorch's fused formula, so an fp32 update is bitwise
// torch.Tensor.lerp_ (what timm's ModelEmaV3 applies per tensor).
#pragma once
#include <cmath>

#include "core/common.h"

namespace vit {

// PyTorch's lerp(start, end, w) in T: start + w (end - start) for |w| < 0.5, else
// end - (1 - w)(end - start), each one fused multiply-add (as its vectorised CPU kernel does).
template <typename T>
inline T lerp_fused(T start, T end, T w) {
  const T diff = end - start;
  return std::abs(w) < T(0.5) ? std::fma(w, diff, start) : std::fma(-(T(1) - w), diff, end);
}

namespace cpu {
// ema, params (n): ema = lerp_fused(ema, params, T(1 - decay)). decay 0 copies params.
template <typename T>
void ema_update(T* ema, const T* params, Index n, double decay);
}  // namespace cpu

}  // namespace vit
