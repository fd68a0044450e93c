// TrainArgs -> data::BatchConfig / data::MixupConfig, and the validation of the augmentation
// flags (--aa, --reprob, --mixup, --cutmix, --color-jitter, --scale, --ratio,
// --train-interpolation, --crop-pct).
#pragma once
#include <vector>

#include "cli/train_args.h"
#include "data/augment.h"
#include "data/batch.h"

namespace vit {

// Throws vit::Error (one line naming the flag) for a bad augmentation flag.
void validate_augment_args(const TrainArgs& a);

// Train-split config: pad-crop/flip as before, plus the timm pipeline options that are set.
data::BatchConfig train_batch_config(const TrainArgs& a, int img_size,
                                     const std::vector<float>& mean, const std::vector<float>& std);
// Eval-split config: no random augmentation; --crop-pct selects timm's resize + centre crop.
data::BatchConfig eval_batch_config(const TrainArgs& a, int img_size,
                                    const std::vector<float>& mean, const std::vector<float>& std);

data::MixupConfig mixup_config(const TrainArgs& a);

}  // namespace vit
