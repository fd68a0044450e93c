// CIFAR-10 / CIFAR-100 "binary version" readers (https://www.cs.toronto.edu/~kriz/cifar.html).
//
// CIFAR-10 (cifar-10-batches-bin/): data_batch_1.bin .. data_batch_5.bin (train), test_batch.bin
//   (test); records of 1 label byte + 3072 pixel bytes (R, G, B planes of 32x32, row-major);
//   class names from batches.meta.txt when present.
// CIFAR-100 (cifar-100-binary/): train.bin, test.bin; records of 2 label bytes (coarse, fine) +
//   3072 pixel bytes; the FINE label (0..99) is used; names from fine_label_names.txt when present.
// The directory given may be the folder holding the files or its parent (containing
// cifar-10-batches-bin/ or cifar-100-binary/).
// Output: ImageDataset with n records, channels 3, 32x32, pixels (n, 3, 32, 32) CHW uint8.
// Errors (vit::Error naming the file): missing files, a size that is not a non-zero multiple of
// the record size, a label out of range.
#pragma once
#include <string>

#include "data/dataset.h"

namespace vit::data {

enum class CifarKind { None, Cifar10, Cifar100 };

struct CifarLayout {
  CifarKind kind = CifarKind::None;
  std::string dir;  // folder that holds the .bin files
};

// Looks for CIFAR binary files in dir, dir/cifar-10-batches-bin, dir/cifar-100-binary.
// kind == None when none is found (no error).
CifarLayout detect_cifar(const std::string& dir);

// Loads the train (all five batches for CIFAR-10) or test split. Throws vit::Error when dir holds
// no CIFAR layout or a file is bad.
ImageDataset load_cifar(const std::string& dir, bool train);

}  // namespace vit::data
