// libFuzzer target: the --class-map file reader (data/image_folder.h).
#include "data/image_folder.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static vit::fuzz::MemFile file("class_map");
  file.set(data, size);
  return vit::fuzz::expect_value_or_error([&] { (void)vit::data::read_class_map(file.path()); });
}
