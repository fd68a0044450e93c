// The plan of a batch of crop -> resize -> flip -> normalise (-> erase), the pixel work of
// timm's RandomResizedCrop / Resize + CenterCrop, hflip, Normalize and RandomErasing (issue 15).
// A loader thread draws every random choice and computes PIL's fixed-point resampling tables
// (data/planned_batch.h);
// the pixel work then runs as batched ops on either backend (src/ops/cpu/resize_batch.cpp, the
// reference, and its CUDA twin), so the images can travel to the device as uint8 crops.
// Plain data shared by the data layer and the ops.
#pragma once
#include <cstdint>

#include "core/erase_plan.h"

namespace vit {

// One planned sample. Offsets index the batch's buffers:
//  * pixels: the crop, (C, bh, bw) uint8, every pixel the resampling reads;
//  * rows:   the horizontal pass's output (C, bh, S) uint8 in the scratch buffer;
//  * tables: per axis of output size S, first (S), count (S) and k (S, ksize) int32s, in that
//            order, PIL's weights scaled by 2^22 (data/augment.h: PilCoeffs). An axis whose input
//            already has S pixels has the unit table (first = index, count 1, k = 2^22), which
//            gives PIL's skipped pass bit for bit.
struct ResizeSample {
  int64_t pixels = 0;  // offset of the crop (C, bh, bw) in the pixel buffer
  int64_t rows = 0;    // offset of the horizontal pass (C, bh, S) in the scratch buffer
  int32_t bh = 0, bw = 0;
  int32_t h_table = 0, h_ksize = 0;  // horizontal (along x) table, offset in the table buffer
  int32_t v_table = 0, v_ksize = 0;  // vertical (along y) table
  int32_t flip = 0;                  // 1: mirror the output horizontally
  int32_t reserved = 0;
  ErasePlan erase;  // random erasing of the normalised image (none: erase.h == 0)
};

constexpr int kResizePrecision = 22;  // fixed-point bits of the tables (PIL's)

// One fixed-point tap sum -> uint8: PIL's rounding start, arithmetic shift, clip.
inline uint8_t resize_clip8(int32_t acc) {
  const int32_t v = acc >> kResizePrecision;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace vit
