// safetensors reader and writer (format: 8-byte little-endian header length, JSON header,
// raw little-endian row-major tensor bytes). The reader validates everything a hostile file can
// get wrong (header size, JSON, dtypes, shapes, offsets tiling the buffer exactly, file size) and
// throws vit::Error with one clear message. The writer follows the reference layout (tensors
// sorted by descending dtype alignment then name, header padded with spaces to a multiple of 8,
// "format": "pt" in __metadata__) and writes atomically (temp file + fsync + rename).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/common.h"

namespace vit::io {

enum class DType { F32, F64, BF16, F16, I64, I32, U8 };
const char* dtype_name(DType d);
int dtype_size(DType d);

struct Tensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<Index> shape;
  std::vector<uint8_t> data;  // raw little-endian bytes, numel * dtype_size
  Index numel() const;
  // Converts F32/F64/BF16/F16 data to float / double (throws for integer dtypes).
  std::vector<float> to_f32() const;
  std::vector<double> to_f64() const;
};

struct SafeTensors {
  std::map<std::string, std::string> metadata;  // __metadata__ (string -> string)
  std::vector<Tensor> tensors;                  // in file order

  const Tensor* find(const std::string& name) const;  // nullptr if absent
  const Tensor& at(const std::string& name) const;    // throws vit::Error naming the key
  void add_f32(const std::string& name, std::vector<Index> shape, const float* values);
  void add(Tensor t);
};

SafeTensors read_safetensors(const std::string& path);
void write_safetensors(const std::string& path, const SafeTensors& st);  // atomic

}  // namespace vit::io
