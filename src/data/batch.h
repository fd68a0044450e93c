// Turns samples of an in-memory data set into a normalised float batch and soft targets.
// Every random choice of a sample comes from (seed, epoch, sample index), so batches do not
// depend on thread count or on where a resumed run picked up.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/augment.h"
#include "data/dataset.h"

namespace vit::data {

struct BatchConfig {
  int img_size = 28;             // output side S (bilinear resize when it differs from the data)
  int crop_padding = 0;          // train: random crop of the padded image (0 = off)
  double hflip = 0.0;            // train: horizontal flip probability
  double smoothing = 0.0;        // label smoothing of the one-hot targets
  std::vector<float> mean, std;  // (channels)
  // RandAugment in timm's grammar ("rand-m9-mstd0.5-inc1"; "" = off). A magnitude_override >= 0
  // replaces the string's m (EfficientTrain++'s magnitude schedule sets it from the progress).
  std::string auto_augment;
  double magnitude_override = -1.0;
  // timm train pipeline (data/augment.h). Any of rrc, color_jitter > 0, reprob > 0,
  // auto_augment or eval_crop_pct > 0 switches a split to it; with all off make_batch is the
  // crop_padding/hflip path above, bitwise unchanged. Pipeline order as timm: RandomResizedCrop
  // (or a plain resize) -> hflip -> RandAugment, else colour jitter -> normalise -> erasing.
  bool rrc = false;
  double scale_lo = 0.08, scale_hi = 1.0;             // RRC area fraction range
  double ratio_lo = 3.0 / 4.0, ratio_hi = 4.0 / 3.0;  // RRC aspect range (log-uniform)
  std::string interpolation = "bicubic";              // train: bilinear | bicubic | random
  double color_jitter =
      0.0;              // ColorJitter strength (brightness = contrast = saturation); off with AA
  double reprob = 0.0;  // RandomErasing probability (mode pixel, count 1)
  double eval_crop_pct = 0.0;  // eval: > 0 = resize shorter side to S / pct, centre crop S
  std::string eval_interpolation = "bicubic";

  // The loader keys prefetched batches by their config, so a change mid-run rebuilds them.
  bool operator==(const BatchConfig&) const = default;
};

// True when cfg selects the timm pipeline for the given split.
bool uses_timm_pipeline(const BatchConfig& cfg, bool train);

class RandAugment;

// One sample of any size through the timm pipeline: src (C, h, w) -> dst (C, S, S), normalised.
// cfg's RandAugment for the split; null when --aa is off or for evaluation.
std::unique_ptr<RandAugment> make_rand_augment(const BatchConfig& cfg, bool train);

// Eval with eval_crop_pct <= 0 is a plain resize to S x S. `ra` is null when --aa is off.
void timm_sample(const uint8_t* src, Index C, Index h, Index w, const BatchConfig& cfg,
                 const RandAugment* ra, bool train, Rng& rng, float* dst);

// The part of an (h, w) source image timm_sample reads with the draws rng will make: the
// RandomResizedCrop box when training with it (torchvision crops before it resizes), else the
// whole image. rng is a copy: the caller's stream is left as it is.
CropBox timm_sample_reads(Index h, Index w, const BatchConfig& cfg, bool train, Rng rng);

// timm_sample on a source of which src holds only `part` of the (h, w) image, as (C,
// part.height, part.width): the same result, as long as part contains timm_sample_reads' box
// for the same rng (a decoder can then decode just that: Source::read_region).
void timm_sample_part(const uint8_t* src, Index C, Index h, Index w, const CropBox& part,
                      const BatchConfig& cfg, const RandAugment* ra, bool train, Rng& rng,
                      float* dst);

// targets (K): the label-smoothed one-hot of `label`.
void smoothed_one_hot(int32_t label, Index K, double smoothing, float* targets);

// In place: targets (B, from_k) -> (B, to_k), to_k >= from_k, the extra classes 0 (a model head
// wider than the data's class count, --num-classes). The buffer must hold B * to_k floats.
void widen_targets(float* targets, Index B, Index from_k, Index to_k);

// images (B, C, S, S), targets (B, K). `train` enables the random augmentation.
void make_batch(const ImageDataset& d, const Index* indices, Index B, const BatchConfig& cfg,
                bool train, uint64_t seed, uint64_t epoch, float* images, float* targets);

// The sample order of one epoch: a permutation of [0, n) from (seed, epoch).
std::vector<Index> epoch_order(Index n, uint64_t seed, uint64_t epoch);

// Repeated augmentation (timm's --aug-repeats, DeiT's RASampler on one process): each sample of
// the permutation appears `repeats` times in a row, the list cut to n entries, so an epoch keeps
// its length and sees n / repeats distinct samples. Repeat r of sample i is the virtual index
// i + r * n: batch builders read sample v % n and seed its augmentation from v, so the repeats
// differ. repeats == 1 is epoch_order.
std::vector<Index> epoch_order_repeated(Index n, uint64_t seed, uint64_t epoch, int repeats);

}  // namespace vit::data
