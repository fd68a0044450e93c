// EfficientTrain++'s two low-frequency maps from the final side F to a training side S as one
// complex axis operator M (S, F): a channel x (F, F) maps to Re(M x M^T) (S, S), since both
// maps are separable and linear. The batched input ops (src/ops/*/lowfreq_batch) apply them as
// matrix products where the images are made (--augment-on-device); data/lowfreq.h keeps the
// per-image references (FFTW, and torch's antialiased interpolation), which these match to
// float rounding (~1e-6 of the image's range).
#pragma once
#include <cstdint>
#include <vector>

#include "core/common.h"

namespace vit {

enum class LowFreqKind : int32_t {
  kFft = 0,         // EfficientTrain's spectral crop (methods.md §2.2)
  kDownsample = 1,  // antialiased bilinear down-sampling (methods.md §2.3)
};

// The low-frequency pass of a planned batch: none when side == 0.
struct LowFreqPass {
  LowFreqKind kind = LowFreqKind::kFft;
  int32_t side = 0;  // S, the training side; the plan's images are made at the final side F
  bool active() const { return side > 0; }
};

// One axis of torch's antialiased bilinear interpolation (aten's "_aa" kernels) from in_size to
// out_size: output i reads in[xmin[i] .. xmin[i] + xsize[i]) with weights w[i * max_size + k],
// normalised to sum 1.
struct AntialiasAxis {
  std::vector<int> xmin, xsize;
  std::vector<double> w;  // (out_size, max_size)
  int max_size = 0;
};
AntialiasAxis antialias_axis(int in_size, int out_size);

// The operator of `kind` from F to S as (2, S, F) floats: Re M then Im M (all zero for the
// down-sampling), computed in double and rounded once. kFft needs S even, 2 <= S <= F;
// kDownsample 1 <= S <= F. Cached per (kind, F, S) (thread-safe; the reference stays valid for
// the life of the process). Throws vit::Error on a bad shape.
const std::vector<float>& lowfreq_operator(LowFreqKind kind, Index F, Index S);

}  // namespace vit
