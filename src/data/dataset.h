// In-memory image data sets (uint8 pixels) and their loading from a data directory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/common.h"

namespace vit::data {

struct ImageDataset {
  Index n = 0, channels = 0, height = 0, width = 0;
  std::vector<uint8_t> pixels;  // (n, channels, height, width)
  std::vector<int32_t> labels;  // (n), each in [0, num_classes)
  int num_classes = 0;
  std::vector<std::string> class_names;  // (num_classes)
};

struct DataSplits {
  std::string format;  // "idx", "cifar10", "cifar100"
  ImageDataset train, val;
  std::vector<float> mean, std;  // (channels) normalisation, from the training split
};

// Loads a data directory. Supported: an IDX image/label pair per split (MNIST family:
// train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-... ) or a CIFAR-10/100
// binary directory (see data/cifar.h; test_batch.bin / test.bin is the val split). Throws
// vit::Error naming the directory and what was expected when nothing fits.
DataSplits load_data_dir(const std::string& dir);

// Per-channel mean and standard deviation of the pixels scaled to [0, 1].
void channel_stats(const ImageDataset& d, std::vector<float>& mean, std::vector<float>& std);

}  // namespace vit::data
