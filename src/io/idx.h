// IDX files (the MNIST family's format), plain or gzip-compressed, unsigned-byte data only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/common.h"

namespace vit::io {

struct IdxArray {
  std::vector<Index> dims;
  std::vector<uint8_t> data;  // row-major, product(dims) bytes
};

// Throws vit::Error naming the file for a bad magic, an unsupported type, truncation or extra
// bytes.
IdxArray read_idx(const std::string& path);

struct IdxDataset {
  Index n = 0, rows = 0, cols = 0;
  std::vector<uint8_t> images;  // (n, rows, cols)
  std::vector<uint8_t> labels;  // (n)
};

// An image file (n, rows, cols) with its label file (n); counts must agree.
IdxDataset read_idx_pair(const std::string& images_path, const std::string& labels_path);

}  // namespace vit::io
