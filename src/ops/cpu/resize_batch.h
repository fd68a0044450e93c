// Batched crop -> resize -> flip -> normalise (-> erase -> mixup/cutmix) of planned uint8 crops
// (core/resize_plan.h): the CPU reference of the device's input ops (src/ops/cuda/resize_batch.cu
// gives the same bytes). Every pass is integer arithmetic (PIL's fixed point) or a table lookup, so
// the GPU twins are checked bit for bit, and the uint8 result is PIL's (data/augment.h: resize_pil
// + hflip).
#pragma once
#include <cstdint>

#include "core/batch_mix.h"
#include "core/common.h"
#include "core/resize_plan.h"

namespace vit::cpu {

// Horizontal pass: for each sample b, scratch[rows] (C, bh, S) = its crop pixels[pixels]
// (C, bh, bw) resampled along x with its horizontal table. tables: the batch's int32 tables.
void resize_rows(const uint8_t* pixels, const int32_t* tables, const ResizeSample* samples, Index B,
                 Index C, Index S, uint8_t* scratch);

// Vertical pass and flip: out (B, C, S, S) uint8 = scratch's (C, bh, S) resampled along y with
// each sample's vertical table, mirrored along x where the sample says so.
void resize_cols(const uint8_t* scratch, const int32_t* tables, const ResizeSample* samples,
                 Index B, Index C, Index S, uint8_t* out);

// images (B, C, S, S) = lut[c][u8 (B, C, S, S)]. lut (C, 256): the normalised value of each
// byte per channel, (v / 255 - mean) / std as the CPU pipeline rounds it (data/planned_batch.h).
// Inside each sample's erase box the value is its noise instead (noise: erase_noise_table(),
// core/erase_plan.h). Then mixed as mix says (core/batch_mix.h): sample b with sample B-1-b, in
// fp32 before the store, as data::mix_images mixes the CPU pipeline's float images.
void normalize_u8(const uint8_t* u8, const float* lut, const float* noise,
                  const ResizeSample* samples, const BatchMix& mix, Index B, Index C, Index S,
                  float* images);

// images (B, C, S, S) = in (B, C, S, S) mixed as mix says (sample b with sample B-1-b, as
// normalize_u8 mixes): the mixing of a batch whose images are made at another side first
// (EfficientTrain++'s low-frequency pass, ops/cpu/lowfreq_batch.h). in and images must not overlap.
void mix_images(const float* in, const BatchMix& mix, Index B, Index C, Index S, float* images);

}  // namespace vit::cpu
