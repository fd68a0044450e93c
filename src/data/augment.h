// timm/torchvision-equivalent image augmentation on uint8 images.
// Layout: every image is planar CHW uint8 (the layout of ImageDataset.pixels), channels 1 or 3.
// PIL semantics are followed where torchvision runs PIL (resize, colour enhance), so results
// match PIL to within its uint8 rounding.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/batch_mix.h"
#include "core/common.h"
#include "core/erase_plan.h"
#include "core/pixel_step.h"
#include "core/rng.h"

namespace vit::data {

enum class Interp { Bilinear, Bicubic };

// "bilinear" | "bicubic"; throws vit::Error otherwise ("random" is resolved by the caller).
Interp parse_interp(const std::string& name);
// timm's training interpolation: bilinear or bicubic, or "random", which draws one of the two
// (one uniform from rng, as timm's RandomResizedCropAndInterpolation).
Interp train_interp(const std::string& name, Rng& rng);

struct CropBox {
  Index top = 0, left = 0, height = 0, width = 0;  // in source pixels
};

// timm RandomResizedCropAndInterpolation.get_params: area fraction uniform in scale, aspect
// log-uniform in ratio, 10 attempts, then the centre crop clamped to the ratio range.
CropBox sample_rrc(Rng& rng, Index H, Index W, double scale_lo, double scale_hi, double ratio_lo,
                   double ratio_hi);

// PIL's fixed-point resampling weights for one axis (precompute_coeffs + normalize_coeffs_8bpc):
// per output index its first source index, tap count and weights scaled by 2^kPilPrecision.
// A pass sums src * k from 2^(kPilPrecision - 1) (rounding) and clips acc >> kPilPrecision to
// uint8; the sums are exact integers, so any order gives PIL's result.
constexpr int kPilPrecision = 22;  // PIL: 32 - 8 - 2 bits
struct PilCoeffs {
  Index ksize = 0;                  // taps per output index (the widest)
  std::vector<Index> first, count;  // (out)
  std::vector<int32_t> k;           // (out, ksize), zero past count
};
PilCoeffs pil_coeffs(Index in_size, Index out_size, Interp f);

// PIL Image.resize of the box of src (C, H, W) to dst (C, oh, ow): separable filter with the
// support widened by the down-scale factor (antialias), 22-bit fixed-point coefficients and a
// uint8 intermediate between the horizontal and the vertical pass, as PIL does.
void resize_pil(const uint8_t* src, Index C, Index H, Index W, const CropBox& box, uint8_t* dst,
                Index oh, Index ow, Interp interp);

void hflip(uint8_t* img, Index C, Index H, Index W);  // in place, (C, H, W)

// torchvision adjust_brightness / adjust_contrast / adjust_saturation on a PIL image (in place,
// (C, H, W)): PIL ImageEnhance = Image.blend(degenerate, img, factor), truncated to uint8.
void adjust_brightness(uint8_t* img, Index C, Index H, Index W, double factor);
void adjust_contrast(uint8_t* img, Index C, Index H, Index W, double factor);
void adjust_saturation(uint8_t* img, Index C, Index H, Index W, double factor);

// torchvision ColorJitter(b, c, s) with b = c = s = strength: factors uniform in
// [1 - strength, 1 + strength], applied in a random order.
void color_jitter(Rng& rng, uint8_t* img, Index C, Index H, Index W, double strength);
// Its draws as the three steps in their order (core/pixel_step.h), for an (H, W) image.
void plan_color_jitter(Rng& rng, double strength, Index H, Index W, PixelStep steps[3]);

// timm RandomErasing(probability, mode='pixel', count 1) on a normalised image (C, H, W):
// area in [0.02, 1/3], log-aspect in [log 0.3, log 1/0.3], 10 attempts, N(0, 1)-shaped noise
// per pixel (core/erase_plan.h). Equals draw_erasing, then apply_erasing.
void random_erasing(Rng& rng, float* img, Index C, Index H, Index W, double probability);
// Its random draws alone (the box and the noise's key), which --augment-on-device plans.
ErasePlan draw_erasing(Rng& rng, Index H, Index W, double probability);
void apply_erasing(const ErasePlan& e, float* img, Index C, Index H, Index W);

// timm's eval geometry: resize (H, W) to (resized_h, resized_w), keep the size x size window at
// (top, left). crop_pct > 0: the shorter side to floor(size / crop_pct), the window centred;
// otherwise a plain resize to size x size.
struct CenterCrop {
  Index resized_h = 0, resized_w = 0, top = 0, left = 0;
};
CenterCrop eval_center_crop(Index H, Index W, Index size, double crop_pct);

// timm eval transform: resize the shorter side to floor(size / crop_pct), then centre crop
// size x size. dst (C, size, size).
void eval_resize_crop(const uint8_t* src, Index C, Index H, Index W, uint8_t* dst, Index size,
                      double crop_pct, Interp interp);

// Beta(a, a) sample (via two gamma variates).
double sample_beta(Rng& rng, double a);

struct MixupConfig {
  double mixup_alpha = 0.0, cutmix_alpha = 0.0;  // 0 = off
  double prob = 1.0, switch_prob = 0.5;
};

struct MixupResult {
  double lam = 1.0;
  bool cutmix = false;
  Index y0 = 0, y1 = 0, x0 = 0, x1 = 0;  // cutmix box (rows [y0, y1), cols [x0, x1))
  BatchMix batch_mix() const;            // what the images' mixing needs (core/batch_mix.h)
};

// timm Mixup in 'batch' mode applied after make_batch: sample b is mixed with sample B-1-b
// (the flipped batch). images (B, C, S, S), targets (B, K) (already label-smoothed one-hots, so
// the result equals timm's mixup_target). The RNG is drawn from (seed, epoch, batch_index).
// Equals draw_mixup, then mix_images and mix_targets.
MixupResult apply_mixup(const MixupConfig& cfg, float* images, float* targets, Index B, Index C,
                        Index S, Index K, uint64_t seed, uint64_t epoch, uint64_t batch_index);

// apply_mixup's random draws alone (whether to mix, mixup or cutmix, lam, the box), which do
// not depend on the images: --augment-on-device draws on the host and mixes on the device.
MixupResult draw_mixup(const MixupConfig& cfg, Index B, Index S, uint64_t seed, uint64_t epoch,
                       uint64_t batch_index);
// images (B, C, S, S) and targets (B, K) mixed in place as r says.
void mix_images(const BatchMix& mix, float* images, Index B, Index C, Index S);
void mix_targets(const MixupResult& r, float* targets, Index B, Index K);

}  // namespace vit::data
