// Turns samples of an in-memory data set into a normalised float batch and soft targets.
// Every random choice of a sample comes from (seed, epoch, sample index), so batches do not
// depend on thread count or on where a resumed run picked up.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace vit::data {

struct BatchConfig {
  int img_size = 28;        // output side S (bilinear resize when it differs from the data)
  int crop_padding = 0;     // train: random crop of the padded image (0 = off)
  double hflip = 0.0;       // train: horizontal flip probability
  double smoothing = 0.0;   // label smoothing of the one-hot targets
  std::vector<float> mean, std;  // (channels)
  // RandAugment in timm's grammar ("rand-m9-mstd0.5-inc1"; "" = off). A magnitude_override >= 0
  // replaces the string's m (EfficientTrain++'s magnitude schedule sets it from the progress).
  std::string auto_augment;
  double magnitude_override = -1.0;
};

// images (B, C, S, S), targets (B, K). `train` enables the random augmentation.
void make_batch(const ImageDataset& d, const Index* indices, Index B, const BatchConfig& cfg,
                bool train, uint64_t seed, uint64_t epoch, float* images, float* targets);

// The sample order of one epoch: a permutation of [0, n) from (seed, epoch).
std::vector<Index> epoch_order(Index n, uint64_t seed, uint64_t epoch);

}  // namespace vit::data
