// timm RandAugment (timm/data/auto_augment.py) on uint8 CHW images with PIL semantics.
// Grammar: "rand" followed by dash-separated sections m<int> (magnitude, default 10),
// n<int> (ops per image, 2), p<float> (per-op probability, 0.5), mstd<float> (Gaussian magnitude
// noise, > 100 = uniform in [0, m]), mmax<int> (magnitude cap, 10), inc<0|1> (increasing-severity
// op set). Example: "rand-m9-mstd0.5-inc1" (DeiT).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/pixel_step.h"
#include "core/rng.h"

namespace vit::data {

using vit::RaOp;  // core/pixel_step.h

const char* ra_op_name(RaOp op);

// The most ops per image the grammar accepts (timm's recipes use 2-4).
constexpr int kMaxRandAugmentOps = 100;

struct RandAugmentConfig {
  double magnitude = 10.0, magnitude_std = 0.0, magnitude_max = 10.0;
  int num_ops = 2;
  double prob = 0.5;
  bool increasing = false;
};

// Parses the grammar above; magnitude_override >= 0 replaces m. Throws vit::Error naming the bad
// section.
RandAugmentConfig parse_rand_augment(const std::string& spec, double magnitude_override = -1.0);

// timm's img_mean fill: round(mean * 255) per channel (3 channels; grey uses the first).
std::array<uint8_t, 3> fill_mean_pixel(const std::vector<float>& mean);

// The op's argument at a (noise-free) magnitude level, as timm's level_to_arg functions; `negate`
// stands for timm's 50% random sign of signed args.
double ra_level_arg(RaOp op, double level, bool negate);

// The same fill as the pixel steps take it.
PixelFill pixel_fill(const std::array<uint8_t, 3>& fill);

// One op with an explicit argument (PIL semantics). img (C, H, W), in place. Geometric ops use
// `bicubic` or bilinear sampling and `fill` outside the source.
void ra_apply_op(RaOp op, double arg, uint8_t* img, Index C, Index H, Index W,
                 const std::array<uint8_t, 3>& fill, bool bicubic);

class RandAugment {
 public:
  // resample: "random" (timm's default: bilinear or bicubic per op), "bilinear" or "bicubic"
  // (timm passes the train interpolation when it is not random).
  RandAugment(const RandAugmentConfig& cfg, const std::array<uint8_t, 3>& fill,
              const std::string& resample = "random");
  // n ops drawn with replacement, each applied with probability p at a noisy magnitude.
  void apply(Rng& rng, uint8_t* img, Index C, Index H, Index W) const;
  // The draws of apply, as steps[num_ops()] for an (H, W) image (kNone where p says no).
  void plan(Rng& rng, Index H, Index W, PixelStep* steps) const;
  int num_ops() const { return cfg_.num_ops; }
  PixelFill fill() const { return fill_; }
  const std::vector<RaOp>& ops() const { return ops_; }

 private:
  RandAugmentConfig cfg_;
  PixelFill fill_;    // converted once: apply and the planned batches take it per image
  int resample_ = 0;  // 0 random, 1 bilinear, 2 bicubic
  std::vector<RaOp> ops_;
};

}  // namespace vit::data
