// libFuzzer target: the packed-file reader (data/packed.h): open (mmap + validation), then the
// labels and the first few samples decoded (raw copies or JPEG).
#include "data/packed.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static vit::fuzz::MemFile file("packed");
  file.set(data, size);
  return vit::fuzz::expect_value_or_error([&] {
    const vit::data::PackedReader r(file.path());
    (void)r.labels();
    for (size_t i = 0; i < r.size() && i < 4; ++i) (void)r.decode(i);
  });
}
