// NumPy .npy files (format 1.0, little-endian float32, C order).
#pragma once
#include <string>
#include <vector>

#include "core/common.h"

namespace vit::io {

void write_npy_f32(const std::string& path, const float* data, const std::vector<Index>& shape);
std::vector<float> read_npy_f32(const std::string& path, std::vector<Index>* shape);

}  // namespace vit::io
