// Batches planned on the CPU for the device's pixel work (issue 15). A loader thread decodes,
// draws every random choice of timm's pipeline (RandomResizedCrop box, interpolation, flip,
// RandAugment's or colour jitter's ops, the random erasing box) and computes PIL's resampling
// tables; what it ships is the uint8 crops (the pixels the resampling reads, usually fewer
// bytes than the float image), those tables and the ops as PixelSteps. The batched ops of
// src/ops/{cpu,cuda}/resize_batch and pixel_steps then do the resize, flip, the uint8 ops,
// normalisation (normalize_lut's table) and erasing, and give timm_sample's image: the same
// uint8 pixels bit for bit, then one lookup (and the same erasing noise).
#pragma once
#include <cstdint>
#include <vector>

#include "core/batch_mix.h"
#include "core/common.h"
#include "core/lowfreq_operator.h"
#include "core/pixel_step.h"
#include "core/resize_plan.h"
#include "core/rng.h"
#include "data/batch.h"
#include "data/source.h"

namespace vit::data {

struct PlannedBatch {
  Index C = 0, S = 0;
  std::vector<uint8_t> pixels;        // the crops, each (C, bh, bw), one after another
  std::vector<int32_t> tables;        // the samples' axis tables (core/resize_plan.h)
  std::vector<ResizeSample> samples;  // (B)
  int64_t scratch_bytes = 0;          // the horizontal passes' output, sum of C * bh * S
  int32_t step_slots = 0;             // uint8 ops per sample: RandAugment's n, 3 for jitter
  std::vector<PixelStep> steps;       // (B, step_slots), after the resize and flip
  PixelFill fill;                     // the geometric ops' fill
  BatchMix mix;                       // mixup/cutmix of the whole batch, applied last
  LowFreqPass lowfreq;                // EfficientTrain++: made at S, trained at lowfreq.side
  Index size() const { return Index(samples.size()); }
  Index out_side() const { return lowfreq.active() ? lowfreq.side : S; }  // the model's side
  void clear(Index channels, Index side);  // empty batch of (channels, side, side) images
};

// True when the source's batches go through timm_sample: streamed sources always do,
// in-memory ones only under the timm pipeline (uses_timm_pipeline).
bool plannable(const Source& src, const BatchConfig& cfg, bool train);

// The uint8 ops per sample under cfg: RandAugment's n (ra: make_rand_augment's), 3 for colour
// jitter, else 0.
int32_t pixel_step_slots(const BatchConfig& cfg, const RandAugment* ra, bool train);

// (C, 256): the normalised value of byte v in channel c, computed as timm_sample does.
std::vector<float> normalize_lut(const BatchConfig& cfg, Index C);

// Appends sample src (C, h, w) transformed as timm_sample would with rng and ra (null when --aa
// is off): the same draws in the same order.
void plan_sample(const uint8_t* src, Index C, Index h, Index w, const BatchConfig& cfg,
                 const RandAugment* ra, bool train, Rng& rng, PlannedBatch& batch);

// make_source_batch's planned twin: the same samples (replacements included), randomness and
// targets, with the images left as a plan. targets (B, K), labels (B) (may be null). Throws
// vit::Error when the source and cfg are not plannable.
void make_planned_batch(const Source& src, const Index* indices, Index B, const BatchConfig& cfg,
                        bool train, uint64_t seed, uint64_t epoch, PlannedBatch& batch,
                        float* targets, int32_t* labels);

}  // namespace vit::data
