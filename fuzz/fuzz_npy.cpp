// libFuzzer target: the .npy reader (io/npy.h).
#include "fuzz_util.h"
#include "io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static vit::fuzz::MemFile file("npy");
  file.set(data, size);
  return vit::fuzz::expect_value_or_error([&] {
    std::vector<vit::Index> shape;
    (void)vit::io::read_npy_f32(file.path(), &shape);
  });
}
