#include "io/npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <regex>

#include "io/atomic_file.h"

namespace vit::io {

void write_npy_f32(const std::string& path, const float* data, const std::vector<Index>& shape) {
  Index n = 1;
  for (Index d : shape) n *= d;
  std::string dict = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}{}), }}",
                                 fmt::join(shape, ", "), shape.size() == 1 ? "," : "");
  // magic(6) + version(2) + header length(2) + dict + padding + '\n' = multiple of 64
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t hl = uint16_t(dict.size());
  out.append(reinterpret_cast<const char*>(&hl), 2);
  out += dict;
  out.append(reinterpret_cast<const char*>(data), size_t(n) * sizeof(float));
  write_file_atomic(path, out);
}

std::vector<float> read_npy_f32(const std::string& path, std::vector<Index>* shape) {
  const std::string b = read_file(path);
  if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0 || b[6] != 1)
    throw Error(fmt::format("'{}' is not a version-1 .npy file", path));
  uint16_t hl;
  std::memcpy(&hl, b.data() + 8, 2);
  if (b.size() < 10u + hl) throw Error(fmt::format("'{}' is truncated", path));
  const std::string dict = b.substr(10, hl);
  if (dict.find("'descr': '<f4'") == std::string::npos ||
      dict.find("'fortran_order': False") == std::string::npos)
    throw Error(fmt::format("'{}' is not a C-order float32 array", path));
  std::smatch m;
  if (!std::regex_search(dict, m, std::regex("'shape': \\(([0-9, ]*)\\)")))
    throw Error(fmt::format("'{}': no shape in the header", path));
  std::vector<Index> dims;
  const std::string s = m[1];
  const std::regex number("[0-9]+");
  for (std::sregex_iterator it(s.begin(), s.end(), number), end; it != end; ++it)
    dims.push_back(std::stoll(it->str()));
  Index n = 1;
  for (Index d : dims) n *= d;
  if (b.size() != 10u + hl + size_t(n) * 4)
    throw Error(fmt::format("'{}': data size does not match the shape", path));
  std::vector<float> v(n);
  std::memcpy(v.data(), b.data() + 10 + hl, size_t(n) * 4);
  if (shape) *shape = dims;
  return v;
}

}  // namespace vit::io
