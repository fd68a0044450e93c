// libFuzzer target: the JPEG decode wrapper (data/decode.h) over libjpeg-turbo. The DCT-scaling
// hint varies with the input size so the scaled paths are reached too.
#include "data/decode.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int kHints[] = {0, 1, 8, 64};
  return vit::fuzz::expect_value_or_error(
      [&] { (void)vit::data::decode_image(data, size, kHints[size % 4]); });
}
