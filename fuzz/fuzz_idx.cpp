// libFuzzer target: the IDX reader (io/idx.h), plain or gzip-compressed input.
#include "fuzz_util.h"
#include "io/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static vit::fuzz::MemFile file("idx");
  file.set(data, size);
  return vit::fuzz::expect_value_or_error([&] { (void)vit::io::read_idx(file.path()); });
}
