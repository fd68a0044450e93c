// In-memory image data sets (uint8 pixels), and the detection and loading of a data directory
// (in memory, or streamed from disk through a data::Source).
#pragma once
#include <cstdint>
#include <memory>
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

class Source;  // data/source.h

struct DataSplits {
  std::string format;  // "idx", "cifar10", "cifar100" (in memory), "folder", "packed" (streamed)
  std::shared_ptr<const Source> train, val;
  std::vector<float> mean, std;  // (channels) normalisation
  bool streamed() const { return format == "folder" || format == "packed"; }
};

// ImageNet's normalisation, used for streamed data instead of a pass over all of it.
extern const std::vector<float> kImageNetMean, kImageNetStd;

// Loads (in-memory formats) or indexes (streamed ones) a data directory, detected in this order:
// * CIFAR-10/100 binary batches (data/cifar.h; test_batch.bin / test.bin is the val split);
// * an IDX image/label pair per split (MNIST family: train-images-idx3-ubyte[.gz],
//   train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]);
// * packed files `train.vitpack` + `val.vitpack` (what `vitrain prepare` writes);
// * an ImageFolder root: a train split folder (train/ or training/) and an eval one (val/,
//   valid/, validation/, eval/, evaluation/), see data/image_folder.h.
// In-memory formats normalise with the training split's statistics, streamed ones with
// ImageNet's. class_map (non-empty) pins the class order of ImageFolder data (timm's
// --class-map); for packed data it must equal the classes stored in the files; in-memory
// formats ignore it. Throws vit::Error naming the directory and the layouts expected when
// nothing fits.
DataSplits load_data_dir(const std::string& dir, const std::vector<std::string>& class_map = {});

// Per-channel mean and standard deviation of the pixels scaled to [0, 1].
void channel_stats(const ImageDataset& d, std::vector<float>& mean, std::vector<float>& std);

}  // namespace vit::data
