// Resampling of a channels-last grid (h, w, C) with PyTorch's F.interpolate semantics
// (align_corners=False), with or without antialias. Used to resample the position-embedding
// grid (and its AdamW moments) when the image size changes: timm's checkpoint loading uses
// bicubic + antialias, the image-size curriculum bicubic, EfficientTrain bilinear.
#pragma once
#include "core/common.h"

namespace vit {

enum class Interp { Bilinear, Bicubic };

// src (hi, wi, C) -> dst (ho, wo, C).
void resample_grid(const float* src, Index hi, Index wi, float* dst, Index ho, Index wo, Index C,
                   Interp mode, bool antialias);

// Position embedding (N_old, C) with `prefix` leading class-token rows kept unchanged and a
// square grid after them -> (prefix + g_new^2, C).
void resample_pos_embed(const float* src, Index g_old, float* dst, Index g_new, Index prefix,
                        Index C, Interp mode, bool antialias);

}  // namespace vit
