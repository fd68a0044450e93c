// libFuzzer target: the PNG decode wrapper (data/decode.h) over libpng.
#include "data/decode.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return vit::fuzz::expect_value_or_error([&] { (void)vit::data::decode_image(data, size); });
}
