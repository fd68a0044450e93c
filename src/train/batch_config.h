// TrainArgs -> data::BatchConfig / data::MixupConfig, and the validation of the augmentation
// flags (--aa, --reprob, --mixup, --cutmix, --color-jitter, --scale, --ratio,
// --train-interpolation, --crop-pct).
#pragma once
#include <vector>

#include "data/augment.h"
#include "data/batch.h"
#include "train/train_args.h"

namespace vit {

// Throws vit::Error (one line naming the flag) for a bad augmentation flag.
void validate_augment_args(const TrainArgs& a);

// Train-split config: pad-crop/flip as before, plus the timm pipeline options that are set.
// `streamed` (ImageFolder / packed data, samples of any size) defaults to timm's train
// pipeline: RandomResizedCrop (--scale 0.08,1 unless given) and a flip (0.5 unless --hflip > 0).
data::BatchConfig train_batch_config(const TrainArgs& a, int img_size,
                                     const std::vector<float>& mean, const std::vector<float>& std,
                                     bool streamed = false);
// Eval-split config: no random augmentation; --crop-pct selects timm's resize + centre crop
// (`streamed` data: crop_pct 0.875 unless given, timm's default).
data::BatchConfig eval_batch_config(const TrainArgs& a, int img_size,
                                    const std::vector<float>& mean, const std::vector<float>& std,
                                    bool streamed = false);

data::MixupConfig mixup_config(const TrainArgs& a);

}  // namespace vit
