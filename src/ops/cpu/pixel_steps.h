// Batched uint8 image ops of planned batches (core/pixel_step.h: RandAugment's ops, colour
// jitter) after the resize and flip: the CPU reference of src/ops/cuda/pixel_steps.cu, which
// gives the same bytes.
#pragma once
#include <cstdint>

#include "core/common.h"
#include "core/pixel_step.h"

namespace vit::cpu {

// images (B, C, S, S) uint8, in place: sample b gets steps[b * slots + k] for k = 0, 1, ...,
// slots - 1, in that order (steps (B, slots)).
void apply_pixel_steps(uint8_t* images, const PixelStep* steps, int32_t slots, Index B, Index C,
                       Index S, const PixelFill& fill);

}  // namespace vit::cpu
